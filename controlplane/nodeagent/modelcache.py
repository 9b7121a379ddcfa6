"""A node's model cache: tiers on local storage, one download per model.

``ModelCache.acquire(ref)`` returns a local path to the model's bytes and pins
it until ``release``: from the memory tier (a tmpfs directory) when it is
there, else the disk tier, else it fetches the model from its store (a path
on a shared volume, http(s), or S3: ``s3fetch``) into the disk tier. Concurrent acquires of a
model share one fetch. A fetched file is checked (sha256 and size, when the
spec gives them) before it is published by an atomic rename, so no reader
ever sees a half-written or corrupt model; a model that fails its check never
starts an instance. After a use from disk the model is copied to the memory
tier in the background when it fits, so the next start reads it from RAM.
The disk tier survives a node agent restart (published files carry a small
metadata file and are indexed again at start). What to evict is decided by
``ModelIndex`` (pure).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram

from controlplane.nodeagent import s3fetch
from controlplane.nodeagent.modelindex import Entry, ModelIndex
from controlplane.runtime import models
from controlplane.runtime.errors import FailedPrecondition, ResourceExhausted, Unavailable
from controlplane.runtime.scoring import FETCHING, MODELS_PER_NODE
from controlplane.runtime.validation import short
from galaxy.v1 import common_pb2, nodeagent_pb2

log = logging.getLogger(__name__)

CHUNK = 1 << 20
META = ".meta.json"
PARTIAL = ".partial"

LOOKUPS = Counter(
    "galaxy_model_cache_lookups_total",
    "Model acquisitions by where the bytes were: memory, disk, or store (fetched).",
    ["source"],
)
FETCHED_BYTES = Counter("galaxy_model_fetched_bytes_total", "Bytes fetched from model stores.")
FETCH_SECONDS = Histogram(
    "galaxy_model_fetch_seconds",
    "Time to fetch and check one model from its store.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
EVICTIONS = Counter("galaxy_model_cache_evictions_total", "Models evicted, by tier.", ["tier"])
HELD_BYTES = Gauge("galaxy_model_cache_bytes", "Bytes held in the model cache, by tier.", ["tier"])
REFUSED = Counter(
    "galaxy_model_cache_refused_total",
    "Model acquisitions refused: checksum, size, full (no room among unpinned models), fetch.",
    ["reason"],
)


@dataclass(frozen=True)
class Tier:
    """One cache tier: a directory and its byte capacity."""

    name: str
    root: Path
    capacity_bytes: int


class ModelCache:
    """See the module docstring. ``tiers`` fastest first; the last one is
    where fetches land (disk)."""

    def __init__(
        self,
        tiers: list[Tier],
        *,
        fetch_timeout_s: float = 600.0,
        max_fetches: int = 4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not tiers:
            raise ValueError("a model cache needs at least one tier")
        self.tiers = {t.name: t for t in tiers}
        self.landing = tiers[-1]
        self.index = ModelIndex({t.name: t.capacity_bytes for t in tiers}, clock)
        self.fetch_timeout_s = fetch_timeout_s
        self._fetches: dict[str, asyncio.Future[Entry]] = {}
        #: digest -> bytes expected (0: unknown) of each fetch in _fetches
        self._fetch_sizes: dict[str, int] = {}
        self._slots = asyncio.Semaphore(max_fetches)
        self._background: set[asyncio.Task[None]] = set()
        for t in tiers:
            t.root.mkdir(parents=True, exist_ok=True)
            self._scan(t)

    # -- the interface ------------------------------------------------------

    @property
    def queued(self) -> int:
        """Fetches in progress or waiting (placement's fetch queue)."""
        return len(self._fetches)

    async def acquire(self, ref: common_pb2.ModelRef) -> tuple[Path, Entry]:
        """The local path of the model's bytes, pinned until release(entry).
        Raises FailedPrecondition (checksum/size), ResourceExhausted (no room
        among unpinned models), Unavailable (the store did not answer)."""
        digest = models.digest(ref)
        for _ in range(3):
            entry = self.index.find(digest)
            if entry is not None:
                LOOKUPS.labels(entry.tier).inc()
            else:
                fut = self._fetches.get(digest)
                if fut is None:
                    fut = asyncio.ensure_future(self._fetch(ref, digest))
                    self._fetches[digest] = fut
                    self._fetch_sizes[digest] = ref.size_bytes
                    fut.add_done_callback(lambda _: self._fetched(digest))
                entry = await asyncio.shield(fut)
                LOOKUPS.labels("store").inc()
            # Another start may have evicted it while this one waited for the
            # fetch (only unpinned entries are evicted): look again.
            if self.index.get(entry.tier, digest) is entry:
                break
        else:
            REFUSED.labels("full").inc()
            raise ResourceExhausted(f"model {short(ref.uri)}: evicted as fast as fetched")
        self.index.pin(entry)
        if entry.tier == self.landing.name and len(self.tiers) > 1:
            self._spawn(self._promote(entry))
        return self._path(entry.tier, digest), entry

    async def warm(self, ref: common_pb2.ModelRef) -> nodeagent_pb2.WarmModelReply:
        """Fetch ``ref`` as a start would, and unpin it at once (warm-up)."""
        t0 = time.monotonic()
        fetched = self.index.find(models.digest(ref)) is None
        _, entry = await self.acquire(ref)
        self.release(entry)
        return nodeagent_pb2.WarmModelReply(
            tier=entry.tier, fetched=fetched, seconds=time.monotonic() - t0
        )

    def release(self, entry: Entry) -> None:
        """An instance that acquired entry ended."""
        self.index.unpin(entry)

    def held(self) -> list[common_pb2.ModelHeld]:
        """What this node reports to placement (bounded): its fetches in
        progress first (tier ``fetching``: the node's fetch queue), then the
        models it holds, the most recently used first."""
        out = [
            common_pb2.ModelHeld(digest=d, tier=FETCHING, size_bytes=size)
            for d, size in itertools.islice(self._fetch_sizes.items(), MODELS_PER_NODE)
        ]
        out += [
            common_pb2.ModelHeld(digest=e.digest, tier=e.tier, size_bytes=e.size)
            for e in self.index.report(MODELS_PER_NODE - len(out))
        ]
        return out

    def _fetched(self, digest: str) -> None:
        self._fetches.pop(digest, None)
        self._fetch_sizes.pop(digest, None)

    async def close(self) -> None:
        """Stop background promotions."""
        for t in list(self._background):
            t.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    # -- files ----------------------------------------------------------------

    def _path(self, tier: str, digest: str) -> Path:
        return self.tiers[tier].root / digest

    def _scan(self, tier: Tier) -> None:
        """Index what an earlier run published (meta file beside the bytes);
        drop partial files a crash left behind."""
        for p in tier.root.iterdir():
            if p.name.endswith(PARTIAL):
                p.unlink(missing_ok=True)
            elif p.name.endswith(META):
                data = p.with_name(p.name[: -len(META)])
                try:
                    meta = json.loads(p.read_text())
                    size = data.stat().st_size
                except (OSError, ValueError):
                    continue
                if size == meta.get("size"):
                    self.index.add(data.name, tier.name, size)
        HELD_BYTES.labels(tier.name).set(self.index.held(tier.name))

    def _make_room(self, tier: str, size: int) -> bool:
        plan = self.index.plan_room(tier, size)
        if plan is None:
            return False
        for e in plan:
            self.index.remove(e)
            for p in (self._path(e.tier, e.digest), self._meta(e.tier, e.digest)):
                p.unlink(missing_ok=True)
            EVICTIONS.labels(e.tier).inc()
            log.info("model %s evicted from %s (%d bytes)", e.digest[:12], e.tier, e.size)
        return True

    def _meta(self, tier: str, digest: str) -> Path:
        return self.tiers[tier].root / (digest + META)

    def _publish(self, tier: str, digest: str, tmp: Path, size: int, uri: str) -> Entry:
        """Atomically make tmp the model's file in tier (rename), then record it."""
        os.replace(tmp, self._path(tier, digest))
        self._meta(tier, digest).write_text(json.dumps({"size": size, "uri": uri}))
        entry = self.index.add(digest, tier, size)
        HELD_BYTES.labels(tier).set(self.index.held(tier))
        return entry

    # -- fetching -------------------------------------------------------------

    async def _fetch(self, ref: common_pb2.ModelRef, digest: str) -> Entry:
        tier = self.landing.name
        if ref.size_bytes and not self._make_room(tier, ref.size_bytes):
            REFUSED.labels("full").inc()
            raise ResourceExhausted(
                f"model {short(ref.uri)}: {ref.size_bytes} bytes do not fit the node's "
                f"{tier} cache (its other models are in use); try another node"
            )
        tmp = self.landing.root / (digest + f".{os.getpid()}{PARTIAL}")
        t0 = time.perf_counter()
        try:
            async with self._slots:
                size, sha = await asyncio.wait_for(
                    self._download(ref.uri, tmp), self.fetch_timeout_s
                )
            self._check(ref, size, sha)
            if not ref.size_bytes and not self._make_room(tier, size):
                REFUSED.labels("full").inc()
                raise ResourceExhausted(
                    f"model {short(ref.uri)}: {size} bytes do not fit the node's {tier} cache"
                )
            entry = self._publish(tier, digest, tmp, size, ref.uri)
        except TimeoutError:
            REFUSED.labels("fetch").inc()
            raise Unavailable(
                f"model {short(ref.uri)}: not fetched within {self.fetch_timeout_s:g}s"
            ) from None
        finally:
            tmp.unlink(missing_ok=True)
        FETCHED_BYTES.inc(size)
        FETCH_SECONDS.observe(time.perf_counter() - t0)
        log.info("model %s fetched: %d bytes in %.2fs", short(ref.uri), size,
                 time.perf_counter() - t0)  # fmt: skip
        return entry

    def _check(self, ref: common_pb2.ModelRef, size: int, sha: str) -> None:
        if ref.size_bytes and size != ref.size_bytes:
            REFUSED.labels("size").inc()
            raise FailedPrecondition(
                f"model {short(ref.uri)}: {size} bytes arrived, the spec says {ref.size_bytes}"
            )
        if ref.sha256 and sha != ref.sha256:
            REFUSED.labels("checksum").inc()
            raise FailedPrecondition(
                f"model {short(ref.uri)}: sha256 mismatch (got {sha[:16]}..., the spec says "
                f"{ref.sha256[:16]}...): not started"
            )

    async def _download(self, uri: str, tmp: Path) -> tuple[int, str]:
        """Bytes of uri into tmp; (size, sha256 hex)."""
        if uri.startswith(("http://", "https://")):
            return await self._download_http(uri, tmp)
        if uri.startswith("s3://"):
            try:
                return await asyncio.to_thread(s3fetch.download, uri, tmp, CHUNK)
            except (Unavailable, FailedPrecondition):
                REFUSED.labels("fetch").inc()
                raise
        return await asyncio.to_thread(_copy_file, models.local_path(uri), tmp)

    async def _download_http(self, uri: str, tmp: Path) -> tuple[int, str]:
        import aiohttp  # here, not at every agent's start: most fetch no model over HTTP

        h, size = hashlib.sha256(), 0
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=30)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as s, s.get(uri) as resp:
                if resp.status != 200:
                    REFUSED.labels("fetch").inc()
                    raise Unavailable(f"model {short(uri)}: the store answered HTTP {resp.status}")
                with tmp.open("wb") as f:
                    async for chunk in resp.content.iter_chunked(CHUNK):
                        h.update(chunk)
                        f.write(chunk)
                        size += len(chunk)
        except aiohttp.ClientError as e:
            REFUSED.labels("fetch").inc()
            raise Unavailable(f"model {short(uri)}: fetch failed: {short(str(e))}") from None
        return size, h.hexdigest()

    # -- promotion ------------------------------------------------------------

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _promote(self, entry: Entry) -> None:
        """Copy a disk-tier model to the fastest tier if it fits there."""
        fast = next(iter(self.tiers.values()))
        if self.index.get(fast.name, entry.digest) is not None:
            return
        if not self._make_room(fast.name, entry.size):
            return  # the memory tier is busy with models in use: stay on disk
        tmp = fast.root / (entry.digest + f".{os.getpid()}{PARTIAL}")
        src = self._path(entry.tier, entry.digest)
        try:
            await asyncio.to_thread(shutil.copyfile, src, tmp)
            uri = json.loads(self._meta(entry.tier, entry.digest).read_text()).get("uri", "")
            self._publish(fast.name, entry.digest, tmp, entry.size, uri)
        except (OSError, ValueError) as e:
            log.warning("model %s not copied to %s: %s", entry.digest[:12], fast.name, e)
        finally:
            tmp.unlink(missing_ok=True)


def _copy_file(src: str, tmp: Path) -> tuple[int, str]:
    """Copy from a shared volume, hashing on the way (in a thread)."""
    h, size = hashlib.sha256(), 0
    try:
        with open(src, "rb") as fin, tmp.open("wb") as fout:
            while chunk := fin.read(CHUNK):
                h.update(chunk)
                fout.write(chunk)
                size += len(chunk)
    except OSError as e:
        REFUSED.labels("fetch").inc()
        raise Unavailable(f"model {short(src)}: cannot read: {e.strerror}") from None
    return size, h.hexdigest()


def release_quietly(cache: ModelCache | None, entry: Entry | None) -> None:
    """Release if there is something to release (instance teardown paths)."""
    if cache is not None and entry is not None:
        cache.release(entry)
