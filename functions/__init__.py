"""Galaxy control functions."""

from controlplane.runtime.compiled import check as _check_compiled

# An optional compiled build (scripts/build_fast.py) must match its sources.
_check_compiled()
