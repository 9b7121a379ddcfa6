"""Galaxy control functions."""
