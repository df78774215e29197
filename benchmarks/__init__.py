"""Benchmarks: scripts that print numbers (not tests); run one with python -m benchmarks.<name>."""
