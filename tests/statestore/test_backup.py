"""`galaxy store backup` / `restore`: the durable records round-trip
byte-for-byte, leased records are left out, a non-empty store is refused
unless --replace, and a damaged file is refused before anything is written;
end to end, a control plane restored into a new etcd serves the function
deployed before the backup."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from statestore import MemoryStore
from statestore.backup import DURABLE, BackupError, dump_lines, parse_lines, restore, snapshot
from tests.etcd_server import EtcdServer
from tests.integration.upctl import REPO, GalaxyUp

RECORDS = [
    ("/galaxy/functions/echo", b"\x0a\x04echo"),
    ("/galaxy/revisions/echo/00001", b"\x0a\x04echo\x70\x01"),
    ("/galaxy/tokens/0123456789abcdef", b'{"id": "0123456789abcdef"}'),
    ("/galaxy/runtimes/python", b"\x0a\x06python"),
    ("/galaxy/controller/scale/dispatch", b'{"desired": 2}'),
]


async def _filled() -> MemoryStore:
    store = MemoryStore()
    await store.put_many(RECORDS)
    # Leased, per-process records: never in a backup.
    await store.put("/galaxy/instances/echo/i-1", b"running")
    await store.put("/galaxy/nodes/node-1", b"alive")
    await store.put("/galaxy/controller/leader", b"{}")
    return store


async def test_round_trip_keeps_bytes_and_leaves_out_leased_records() -> None:
    src = await _filled()
    lines = list(dump_lines(await snapshot(src)))
    records = parse_lines(lines)
    assert records == sorted(RECORDS)
    dst = MemoryStore()
    assert await restore(dst, records, replace=False) == len(RECORDS)
    for key, value in RECORDS:
        kv = await dst.get(key)
        assert kv is not None and kv.value == value
    assert await dst.get_prefix("/galaxy/instances/") == []
    assert await dst.get("/galaxy/controller/leader") is None


async def test_a_non_empty_store_is_refused_unless_replaced() -> None:
    records = parse_lines(list(dump_lines(sorted(RECORDS))))
    dst = MemoryStore()
    await dst.put("/galaxy/functions/other", b"x")
    with pytest.raises(BackupError, match="--replace"):
        await restore(dst, records, replace=False)
    assert (await dst.get("/galaxy/functions/echo")) is None  # nothing written
    await restore(dst, records, replace=True)
    assert await dst.get("/galaxy/functions/other") is None
    assert (await dst.get("/galaxy/functions/echo")) is not None


def test_damaged_files_are_refused_naming_the_line() -> None:
    lines = list(dump_lines(sorted(RECORDS)))
    with pytest.raises(BackupError, match="line 1"):
        parse_lines(["not json", *lines[1:]])
    with pytest.raises(BackupError, match="truncated"):
        parse_lines(lines[:-1])
    with pytest.raises(BackupError, match="line 3"):
        parse_lines([*lines[:2], '{"key": "/galaxy/functions/x", "value_b64": "!!"}'])
    with pytest.raises(BackupError, match="outside the durable prefixes"):
        parse_lines([lines[0].replace('"keys": 5', '"keys": 1'),
                     '{"key": "/galaxy/nodes/n", "value_b64": ""}'])  # fmt: skip
    assert all(p.startswith("/galaxy/") and p.endswith("/") for p in DURABLE)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controlplane.tools.cli", *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO)  # fmt: skip


@pytest.mark.integration
@pytest.mark.slow
def test_a_restored_store_serves_what_was_deployed(tmp_path: Path) -> None:
    backup = tmp_path / "galaxy.backup"
    with EtcdServer(tmp_path / "a") as a, EtcdServer(tmp_path / "b") as b:
        g = GalaxyUp(tmp_path / "run-a", "--nodes", "1", "--state", a.url)
        g.start()
        try:
            assert g.cli("deploy", "-f", str(REPO / "examples/echo.yaml")).returncode == 0
        finally:
            g.stop()
        r = _cli("store", "backup", "--state", a.url, "-o", str(backup))
        assert r.returncode == 0, r.stderr
        r = _cli("store", "restore", "--state", b.url, "-f", str(backup))
        assert r.returncode == 0 and "restored" in r.stdout, r.stderr
        # Restoring twice is refused with the way out, and no traceback.
        r = _cli("store", "restore", "--state", b.url, "-f", str(backup))
        assert r.returncode == 1 and "--replace" in r.stderr and "Traceback" not in r.stderr
        g = GalaxyUp(tmp_path / "run-b", "--nodes", "1", "--state", b.url)
        g.start()
        try:
            r = g.cli("invoke", "echo", "--data", "restored")
            assert r.returncode == 0 and '"echo": "restored"' in r.stdout, r.stdout + r.stderr
        finally:
            g.stop()
