"""Tests of the legacy bridge (plugins/legacy) against a plugin server of the original operator."""
