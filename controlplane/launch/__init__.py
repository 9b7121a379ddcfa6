"""Starting Galaxy on one machine: ``galaxy up``'s supervisor of local
component processes (also used by ``galaxy bench`` and ``galaxy calibrate``)."""
