"""The top-level controller: membership of control function instances,
partition coordination, and the admin API for functions."""
