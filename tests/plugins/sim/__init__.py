"""Tests of the simulated fleet plugin and the SDK pieces it owns (operations, validation)."""
