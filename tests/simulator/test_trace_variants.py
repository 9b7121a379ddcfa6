"""The Azure Functions 2019 reader takes the published variants and refuses
anything else naming the file and the column; never a table of zeros."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from simulator import traces
from simulator.experiments import parse_workload
from simulator.traces import TraceError

PCT = [f"percentile_Average_{p}" for p in ("0", "1", "25", "50", "75", "99", "100")]


def write(path: Path, header: list[str], rows: list[list[object]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def make(
    folder: Path,
    *,
    minute_names: list[str],
    counts: list[list[int]],
    hash_function: bool = True,
    trigger: bool = True,
    per_app_memory: bool = False,
    names: tuple[str, str, str] = ("invocations.csv", "durations.csv", "memory.csv"),
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    keys = [("o1", "a1", "f1"), ("o1", "a2", "f2")][: len(counts)]
    head = ["HashOwner", "HashApp"] + (["HashFunction"] if hash_function else [])
    head += ["Trigger"] if trigger else []
    rows = [
        [o, a, *([f] if hash_function else []), *(["http"] if trigger else []), *c]
        for (o, a, f), c in zip(keys, counts, strict=True)
    ]
    write(folder / names[0], head + minute_names, rows)
    dhead = ["HashOwner", "HashApp"] + (["HashFunction"] if hash_function else [])
    write(folder / names[1], [*dhead, "Average", *PCT],
          [[o, a, *([f] if hash_function else []), 100, 1, 10, 50, 100, 200, 900, 1000]
           for o, a, f in keys])  # fmt: skip
    mhead = ["HashOwner", "HashApp"] + (
        ["HashFunction"] if hash_function and not per_app_memory else []
    )
    write(folder / names[2], [*mhead, "AverageAllocatedMb"],
          [[o, a, *([f] if len(mhead) == 3 else []), 256] for o, a, f in keys])  # fmt: skip
    return folder


def total(w) -> int:  # type: ignore[no-untyped-def]
    return sum(len(t) for t, _, _ in w.batches())


@pytest.mark.parametrize(
    "kw",
    [
        dict(minute_names=["1", "2", "3"]),
        dict(minute_names=["minute_1", "minute_2", "minute_3"]),
        dict(minute_names=["1", "2", "3"], hash_function=False, trigger=False),
        dict(minute_names=["1", "2", "3"], per_app_memory=True),
        dict(minute_names=["1", "2", "3"], names=(
            "invocations_per_function_md.anon.d01.csv",
            "function_durations_percentiles.anon.d01.csv",
            "app_memory_percentiles.anon.d01.csv",
        ), per_app_memory=True),
    ],
)  # fmt: skip
def test_published_variants_parse_to_the_counts_written(tmp_path: Path, kw: dict) -> None:
    folder = make(tmp_path / "t", counts=[[3, 0, 2], [1, 4, 0]], **kw)
    w = traces.azure2019(folder)
    assert total(w) == 10 and len(w.functions) == 2
    assert total(traces.azure2019(folder, minutes=1)) == 4


def test_a_folder_with_options_on_the_command_line(tmp_path: Path) -> None:
    folder = make(tmp_path / "t", minute_names=["1", "2"], counts=[[5, 7]])
    assert total(parse_workload(f"{folder}:minutes=1", seed=1)) == 5
    assert total(parse_workload(str(folder), seed=1)) == 12


@pytest.mark.parametrize(
    "kw, file, words",
    [
        (dict(minute_names=["a", "b"]), "invocations.csv", "no minute columns"),
        (dict(minute_names=["1", "2"], counts=[[0, 0]]), "invocations.csv", "no invocations"),
        (dict(minute_names=["1", "2"], counts=[["x", 1]]), "invocations.csv", "column '1'"),
    ],
)
def test_bad_traces_are_refused_naming_file_and_column(
    tmp_path: Path, kw: dict, file: str, words: str
) -> None:
    kw.setdefault("counts", [[1, 2]])
    folder = make(tmp_path / "t", **kw)
    with pytest.raises(TraceError) as e:
        traces.azure2019(folder)
    assert file in str(e.value) and words in str(e.value)


def test_missing_key_column_and_missing_file(tmp_path: Path) -> None:
    folder = make(tmp_path / "t", minute_names=["1"], counts=[[1]])
    write(folder / "invocations.csv", ["HashOwner", "1"], [["o1", 1]])
    with pytest.raises(TraceError, match=r"invocations.csv: column 'HashApp' is missing"):
        traces.azure2019(folder)
    other = make(tmp_path / "u", minute_names=["1"], counts=[[1]])
    (other / "memory.csv").unlink()
    with pytest.raises(TraceError, match="no memory file"):
        traces.azure2019(other)
