"""The node model cache on real files and a real HTTP store: one download
shared by concurrent starts, a corrupted download refused and never
published, LRU eviction that never touches a model in use, the disk tier
kept across a restart, and promotion to the memory tier."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from controlplane.nodeagent.modelcache import ModelCache, Tier
from controlplane.runtime.errors import FailedPrecondition, ResourceExhausted, Unavailable
from galaxy.v1 import common_pb2
from tests.models.store import CountingStore

KIB = 1024


@pytest.fixture
def store(tmp_path: Path):
    root = tmp_path / "store"
    root.mkdir()
    s = CountingStore(root)
    s.root = root  # type: ignore[attr-defined]
    yield s
    s.close()


def _model(store: CountingStore, name: str, size: int, *, good_sha: bool = True):
    data = os.urandom(size)
    (store.root / name).write_bytes(data)  # type: ignore[attr-defined]
    sha = hashlib.sha256(data).hexdigest()
    if not good_sha:
        sha = hashlib.sha256(b"something else").hexdigest()
    return common_pb2.ModelRef(uri=store.url(name), sha256=sha, size_bytes=size), data


def _cache(tmp_path: Path, disk: int, memory: int = 0) -> ModelCache:
    tiers = [Tier("disk", tmp_path / "disk", disk)]
    if memory:
        tiers.insert(0, Tier("memory", tmp_path / "shm", memory))
    return ModelCache(tiers)


async def test_concurrent_starts_share_one_download(store, tmp_path) -> None:
    ref, data = _model(store, "a.bin", 256 * KIB)
    cache = _cache(tmp_path, disk=10 * 256 * KIB)
    got = await asyncio.gather(*(cache.acquire(ref) for _ in range(8)))
    assert store.gets["/a.bin"] == 1
    assert {p for p, _ in got} == {tmp_path / "disk" / ref.sha256}
    assert (tmp_path / "disk" / ref.sha256).read_bytes() == data
    assert got[0][1].pins == 8
    assert [m.digest for m in cache.held()] == [ref.sha256]


async def test_a_corrupt_download_is_refused_and_never_published(store, tmp_path) -> None:
    ref, _ = _model(store, "bad.bin", 64 * KIB, good_sha=False)
    cache = _cache(tmp_path, disk=1024 * KIB)
    with pytest.raises(FailedPrecondition, match="sha256 mismatch"):
        await cache.acquire(ref)
    assert os.listdir(tmp_path / "disk") == []  # no file, no partial, no metadata
    assert cache.held() == []
    short = common_pb2.ModelRef(uri=ref.uri, size_bytes=1)
    with pytest.raises(FailedPrecondition, match="the spec says 1"):
        await cache.acquire(short)
    missing = common_pb2.ModelRef(uri=store.url("nosuch.bin"))
    with pytest.raises(Unavailable, match="HTTP 404"):
        await cache.acquire(missing)


async def test_eviction_is_lru_and_never_takes_a_model_in_use(store, tmp_path) -> None:
    refs = [_model(store, f"m{i}.bin", 100 * KIB)[0] for i in range(4)]
    cache = _cache(tmp_path, disk=250 * KIB)  # room for two
    _, e0 = await cache.acquire(refs[0])  # in use all along
    _, e1 = await cache.acquire(refs[1])
    cache.release(e1)
    await cache.acquire(refs[2])  # evicts m1 (unpinned), not m0 (pinned)
    held = {m.digest for m in cache.held()}
    assert held == {refs[0].sha256, refs[2].sha256}
    assert not (tmp_path / "disk" / refs[1].sha256).exists()
    # Both remaining models are in use: a third cannot be made room for.
    with pytest.raises(ResourceExhausted, match="do not fit"):
        await cache.acquire(refs[3])
    cache.release(e0)


async def test_the_disk_tier_survives_a_restart(store, tmp_path) -> None:
    ref, _ = _model(store, "keep.bin", 128 * KIB)
    first = _cache(tmp_path, disk=1024 * KIB)
    _, entry = await first.acquire(ref)
    first.release(entry)
    (tmp_path / "disk" / "leftover.123.partial").write_bytes(b"half")  # a crash mid-fetch
    again = _cache(tmp_path, disk=1024 * KIB)  # a restarted agent
    path, _ = await again.acquire(ref)
    assert store.gets["/keep.bin"] == 1  # not fetched again
    assert path == tmp_path / "disk" / ref.sha256
    assert not (tmp_path / "disk" / "leftover.123.partial").exists()


async def test_a_model_used_from_disk_moves_to_memory(store, tmp_path) -> None:
    ref, data = _model(store, "hot.bin", 64 * KIB)
    cache = _cache(tmp_path, disk=1024 * KIB, memory=512 * KIB)
    path, entry = await cache.acquire(ref)
    assert entry.tier == "disk"
    await asyncio.gather(*cache._background)  # the copy to the memory tier
    cache.release(entry)
    path, entry = await cache.acquire(ref)
    assert entry.tier == "memory" and path == tmp_path / "shm" / ref.sha256
    assert path.read_bytes() == data
    assert [(m.digest, m.tier) for m in cache.held()] == [(ref.sha256, "memory")]
    await cache.close()


async def test_a_shared_volume_path_is_copied_and_checked(tmp_path) -> None:
    src = tmp_path / "volume" / "w.bin"
    src.parent.mkdir()
    src.write_bytes(b"weights" * 1000)
    ref = common_pb2.ModelRef(uri=str(src), sha256=hashlib.sha256(src.read_bytes()).hexdigest())
    cache = _cache(tmp_path, disk=1024 * KIB)
    path, _ = await cache.acquire(ref)
    assert path.read_bytes() == src.read_bytes()
    with pytest.raises(Unavailable, match="cannot read"):
        await cache.acquire(common_pb2.ModelRef(uri=str(tmp_path / "nope.bin")))


async def test_a_fetch_in_progress_is_reported_as_the_fetch_queue(store, tmp_path) -> None:
    ref, _ = _model(store, "q.bin", 256 * KIB)
    cache = _cache(tmp_path, disk=10 * 256 * KIB)
    start = asyncio.ensure_future(cache.acquire(ref))
    await asyncio.sleep(0)  # one turn: acquire registers its fetch, then waits on it
    assert [(m.digest, m.tier, m.size_bytes) for m in cache.held()] == [
        (ref.sha256, "fetching", 256 * KIB)
    ]
    await start
    assert [(m.digest, m.tier) for m in cache.held()] == [(ref.sha256, "disk")]
