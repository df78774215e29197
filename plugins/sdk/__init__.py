"""What every plugin shares: server bootstrap, client helper, errors and the conformance kit."""
