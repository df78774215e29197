"""Contract tests: the plugin SDK server, client and conformance kit over real gRPC."""
