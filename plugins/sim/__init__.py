"""Simulated fleet plugin: clusters, operations, faults and health data in one process."""

from plugins.sim.config import ConfigError, FleetConfig, load_fleet_file, parse_fleet
from plugins.sim.fleet import Fleet
from plugins.sim.monitor import InvariantMonitor
from plugins.sim.server import SimOptions, Simulator, main

__all__ = [
    "ConfigError",
    "Fleet",
    "FleetConfig",
    "InvariantMonitor",
    "SimOptions",
    "Simulator",
    "load_fleet_file",
    "main",
    "parse_fleet",
]
