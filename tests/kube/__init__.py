"""What the orchestrator relies on of Kubernetes: the real kube-apiserver's behaviour and the
lean HTTP path of orchestrator/adapters/kube.py against it."""
