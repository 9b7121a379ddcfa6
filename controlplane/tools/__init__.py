"""Operator tooling: the ``galaxy`` CLI, ``galaxy calibrate`` and the burst
driver. The top of the import order: it may use every other package."""
