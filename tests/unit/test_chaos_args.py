"""`galaxy chaos` refuses meaningless flags before it starts anything."""

from __future__ import annotations

import pytest

from controlplane.tools import cli


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--rate", "-1"], "--rate"),
        (["--rate", "nan"], "--rate"),
        (["--duration-s", "0"], "--duration-s"),
        (["--nodes", "0"], "--nodes"),
        (["--functions", "-2"], "--functions"),
        (["--outage-s", "-5"], "--outage-s"),
        (["--at-s", "30", "--duration-s", "20"], "--at-s"),
        (["--at-s", "-1"], "--at-s"),
    ],
)
def test_a_meaningless_flag_is_refused_by_name(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    try:
        rc = cli.main(["chaos", *argv, "--out", f"{tmp_path}/r.json"])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    err = capsys.readouterr().err
    assert rc != 0
    assert named in err
    assert "Traceback" not in err
