"""Discrete-event simulator (see docs/simulator.md)."""
