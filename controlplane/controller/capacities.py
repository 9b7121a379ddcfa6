"""The controller's capacity figures T_x (requests/s one instance of each
control function sustains), read from the file `galaxy calibrate` writes.

Reading lives with the controller (which needs it at start); measuring lives
in ``controlplane.tools.calibrate`` (which needs a whole cluster).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

#: Used when no calibration file exists: `galaxy calibrate` on the 2-core
#: reference machine, no CPU limits, rounded down (docs/controller.md).
DEFAULT_T: dict[str, float] = {"dispatch": 2400.0, "schedule": 1100.0, "clustermgr": 2500.0}
_FILE_KEYS = {"dispatch": "t_df", "schedule": "t_sf", "clustermgr": "t_cmf"}


def default_path() -> Path:
    """$GALAXY_CALIBRATION, else ~/.galaxy/calibration.json."""
    env = os.environ.get("GALAXY_CALIBRATION")
    return Path(env) if env else Path.home() / ".galaxy" / "calibration.json"


def calibrated_capacities(path: str | Path | None = None) -> dict[str, float]:
    """T per kind from the calibration file, with ``DEFAULT_T`` for what it
    lacks. An explicitly named file must exist and parse."""
    p = Path(path) if path else default_path()
    out = dict(DEFAULT_T)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        if path:
            raise SystemExit(
                f"galaxy: calibration file {p} not found; run `galaxy calibrate`"
            ) from None
        return out
    except ValueError as e:
        raise SystemExit(f"galaxy: calibration file {p} is not valid JSON: {e}") from None
    for kind, key in _FILE_KEYS.items():
        v = data.get(key)
        if isinstance(v, int | float) and v > 0:
            out[kind] = float(v)
    return out
