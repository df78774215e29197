"""One pass of a run (observe, decide, persist, call); where runs and replicas meet."""
