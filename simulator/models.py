"""Models in the simulator: each function's model size, each node's model
cache, and what a start pays to load the model (``galaxy simulate
--models mixed``; off by default, when no function names a model).

**Sizes.** Each function is given one model of its own, drawn with the
run's seed from ``MIXED``: the published checkpoint files of common
inference models (sizes as their model hubs list them, rounded), weighted
toward the small ones most serverless inference serves. ServerlessLLM
(OSDI'24) evaluates with larger ones (OPT and LLaMA-2, 13-130 GB); the
mix here keeps one LLM in it.

**Caches.** A node's cache is production's ``ModelIndex``
(``controlplane.nodeagent.modelindex``: tiers, LRU eviction); fetched bytes
land in the disk tier and a model used from disk is copied to memory, as
``ModelCache`` does. Models are not pinned by running instances here (the
simulator does not follow an instance to its end on the node), so a full
cache may evict a model in use; with the default capacities (16 GiB of
memory, 200 GiB of disk per node) that is rare.

**Load time** by where the bytes are, with the bandwidths of production's
``model_locality`` term (``ModelLocality``'s defaults): from memory, from
disk, or fetched over the node's link, where fetches queue behind each
other. The placement term the simulated Schedule scores with is that same
term, fed the views these caches report (``info``).

**Baselines** (Knative-like and the others) have no node cache: each start
fetches its model over the node's link (``fetch_only``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.nodeagent.modelindex import ModelIndex
from controlplane.runtime.scoring import FETCHING, ModelLocality, NodeInfo, Placing

GB = 1_000_000_000
MB = 1_000_000
GIB = 1 << 30

#: (model, checkpoint bytes, weight): sizes of the published checkpoints,
#: rounded (fp32 unless noted).
MIXED: tuple[tuple[str, int, float], ...] = (
    ("resnet-50", 98 * MB, 0.25),
    ("bert-base", 440 * MB, 0.25),
    ("gpt2", 548 * MB, 0.15),
    ("t5-base", 892 * MB, 0.10),
    ("whisper-small", 967 * MB, 0.10),
    ("opt-1.3b-fp16", 2_630 * MB, 0.10),
    ("llama-2-7b-fp16", 13_500 * MB, 0.05),
)
DISTRIBUTIONS = {"mixed": MIXED}


def sizes_for(n_functions: int, dist: str, seed: int) -> list[tuple[str, int]]:
    """(model name, bytes) per function, drawn with ``seed``."""
    table = DISTRIBUTIONS[dist]
    rng = random.Random(seed * 7919 + 29)
    names = [t[0] for t in table]
    weights = [t[2] for t in table]
    size = {t[0]: t[1] for t in table}
    return [(m, size[m]) for m in rng.choices(names, weights, k=n_functions)]


@dataclass
class NodeModels:
    """One node's cache (production's ``ModelIndex``) and its link's queue."""

    index: ModelIndex
    #: digest -> (bytes, time the fetch completes)
    fetching: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: when the node's link is free again (fetches queue on it)
    link_free_at: float = 0.0

    def settle(self, now: float) -> None:
        """Fetches done by ``now`` land in the disk tier."""
        for digest, (size, done) in list(self.fetching.items()):
            if done <= now:
                del self.fetching[digest]
                self._add("disk", digest, size)

    def _add(self, tier: str, digest: str, size: int) -> bool:
        if self.index.get(tier, digest) is not None:
            return True
        evict = self.index.plan_room(tier, size)
        if evict is None:
            return False
        for e in evict:
            self.index.remove(e)
        self.index.add(digest, tier, size)
        return True


@dataclass
class ModelSim:
    """The models of one simulated run (see the module docstring)."""

    sizes: list[tuple[str, int]]
    clock: Callable[[], float]
    bandwidth: ModelLocality = field(default_factory=ModelLocality)
    memory_bytes: int = 16 * GIB
    disk_bytes: int = 200 * GIB
    nodes: dict[str, NodeModels] = field(default_factory=dict)

    def placing(self, fn: int, name: str) -> Placing:
        """What the placement term sees of function ``fn``."""
        return Placing(name, self.digest(fn), self.sizes[fn][1])

    @staticmethod
    def digest(fn: int) -> str:
        """Each function's model is its own."""
        return f"model-{fn}"

    def node(self, node_id: str) -> NodeModels:
        """The node's cache (made on first use)."""
        n = self.nodes.get(node_id)
        if n is None:
            caps = {"memory": self.memory_bytes, "disk": self.disk_bytes}
            n = self.nodes[node_id] = NodeModels(ModelIndex(caps, self.clock))
        return n

    def info(self, node_id: str, info: NodeInfo) -> NodeInfo:
        """``info`` with the node's models, as its status reports them."""
        n = self.nodes.get(node_id)
        if n is None:
            return info
        n.settle(self.clock())
        held: dict[str, tuple[str, int]] = {
            d: (FETCHING, size) for d, (size, _) in n.fetching.items()
        }
        for e in n.index.report():
            held.setdefault(e.digest, (e.tier, e.size))
        info.models = held or None
        return info

    def load_s(self, node_id: str, fn: int) -> float:
        """Seconds a start of ``fn`` on the node spends getting its model
        readable and reading it once; updates the node's cache."""
        now = self.clock()
        n = self.node(node_id)
        n.settle(now)
        digest, size = self.digest(fn), self.sizes[fn][1]
        bw = self.bandwidth
        entry = n.index.find(digest)
        if entry is not None:
            n.index.pin(entry)
            n.index.unpin(entry)  # a use: most recently used now
            if entry.tier == "memory":
                return size / bw.memory_bps
            n._add("memory", digest, size)  # copied up for the next start
            return size / bw.disk_bps
        coming = n.fetching.get(digest)
        if coming is not None:
            return coming[1] - now + size / bw.disk_bps
        done = self._fetch(n, now, size)
        n.fetching[digest] = (size, done)
        return done - now + size / bw.disk_bps

    def warm(self, node_ids: list[str], fn: int) -> float:
        """Warm-up (``galaxy models warm``): fetch ``fn``'s model to these
        nodes now, each over its own link (behind its fetch queue); the
        seconds until the last one holds it."""
        now = self.clock()
        digest, size = self.digest(fn), self.sizes[fn][1]
        last = now
        for nid in node_ids:
            n = self.node(nid)
            n.settle(now)
            if n.index.find(digest) is not None or digest in n.fetching:
                continue
            done = self._fetch(n, now, size)
            n.fetching[digest] = (size, done)
            last = max(last, done)
        return last - now

    def fetch_only(self, node_id: str, fn: int) -> float:
        """A start without a node cache: the model over the node's link."""
        now = self.clock()
        n = self.node(node_id)
        return self._fetch(n, now, self.sizes[fn][1]) - now

    def _fetch(self, n: NodeModels, now: float, size: int) -> float:
        done = max(now, n.link_free_at) + size / self.bandwidth.link_bps
        n.link_free_at = done
        return done
