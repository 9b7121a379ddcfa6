"""Fixtures of the simulator tests."""

from pathlib import Path

import pytest

from simulator import calibration

#: ../shared next to the repository (DESIGN.md, traces)
SHARED = Path(__file__).resolve().parents[2].parent / "shared"


@pytest.fixture(scope="session")
def cal() -> calibration.Calibration:
    """The shipped default calibration."""
    return calibration.load()


@pytest.fixture
def shared_data() -> Path:
    """../shared/data, or skip with a clear message."""
    data = SHARED / "data"
    if not data.is_dir():
        pytest.skip(f"trace data not found at {data} (the shared/ folder next to the repo)")
    return data
