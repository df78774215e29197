"""Tests of the provider plugins, one package per plugin."""
