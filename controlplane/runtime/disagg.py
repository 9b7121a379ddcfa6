"""Prefill/decode disaggregation: which pair of instances serves a request,
and what moving its KV cache between them costs (pure: no I/O).

A disaggregated function runs two pools: prefill instances turn the prompt
into a KV cache and the first token, decode instances continue from that
cache. Moving the cache is the price (LLaMA-2-13B holds 819,200 bytes of KV
per token, 8.19 GB at 10k tokens), so the pair is chosen by estimated time:

    transfer (link latency + KV bytes / link bandwidth)
    + the prefill instance's queue ahead of this prompt
    + the decode instance's load (a longer batch makes every token slower)

The link between two instances depends on where they run: the same node (a
Unix socket or shared memory), another host (TCP), or an RDMA-class fabric,
which exists only in the simulator and is named so (``simulated=True``).
Bandwidths are inputs: measured ones come from
``python -m controlplane.bench.kvtransfer``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Link:
    """A path KV bytes can take between two instances."""

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float = 0.0
    #: only the simulator has it (no such hardware here)
    simulated: bool = False

    def transfer_s(self, nbytes: int) -> float:
        """Seconds to move nbytes over this link."""
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s


#: Default links; a deployment replaces the figures with its measured ones.
#: same-node: a Unix socket on this machine (bench, 2026-11-29); tcp: a 10
#: Gbit/s datacenter link; rdma-sim: a 200 Gbit/s RDMA NIC, simulator only.
LINKS: dict[str, Link] = {
    "same-node": Link("same-node", 1.5e9, 50e-6),
    "tcp": Link("tcp", 10e9 / 8, 100e-6),
    "rdma-sim": Link("rdma-sim", 200e9 / 8, 5e-6, simulated=True),
}


@dataclass(frozen=True)
class Candidate:
    """An instance of one pool, as the picker sees it."""

    instance_id: str
    node_id: str
    #: prefill: prompt tokens queued ahead; decode: sequences running
    load: int = 0


@dataclass(frozen=True)
class Pair:
    """The chosen pair and the estimate that chose it."""

    prefill: Candidate
    decode: Candidate
    link: Link
    transfer_s: float
    estimate_s: float


def kv_bytes(prompt_tokens: int, kv_bytes_per_token: int) -> int:
    """KV-cache bytes of a prompt (what a prefill hands to decode)."""
    return prompt_tokens * kv_bytes_per_token


@dataclass(frozen=True)
class PairPicker:
    """Chooses (prefill, decode) by estimated time; see the module docstring.

    ``link_between(node_a, node_b)`` names the link two nodes share;
    ``prefill_tps`` turns queued prompt tokens into seconds;
    ``decode_s_per_seq`` is what one more running sequence adds to each
    decode step, times ``output_tokens`` expected.
    """

    link_between: Callable[[str, str], Link]
    prefill_tps: float
    decode_s_per_seq: float

    def pick(
        self,
        prefill: Sequence[Candidate],
        decode: Sequence[Candidate],
        prompt_tokens: int,
        kv_bytes_per_token: int,
        output_tokens: int = 1,
    ) -> Pair:
        """The pair with the lowest estimate (ties: pool order). ValueError
        when a pool is empty."""
        if not prefill or not decode:
            empty = "prefill" if not prefill else "decode"
            raise ValueError(f"the {empty} pool has no instance")
        size = kv_bytes(prompt_tokens, kv_bytes_per_token)
        best: Pair | None = None
        for p in prefill:
            queued = (p.load + prompt_tokens) / self.prefill_tps
            for d in decode:
                link = self.link_between(p.node_id, d.node_id)
                moving = link.transfer_s(size)
                slower = d.load * self.decode_s_per_seq * output_tokens
                est = queued + moving + slower
                if best is None or est < best.estimate_s:
                    best = Pair(p, d, link, moving, est)
        assert best is not None
        return best


@dataclass(frozen=True)
class RandomPairPicker(PairPicker):
    """The baseline: a prefill and a decode instance drawn at random, with
    no regard for the link between them (the estimate is still reported,
    so the two pickers' pairs compare on the same terms). ``rng``: the
    seeded source of the draws."""

    rng: random.Random = field(default_factory=lambda: random.Random(0), compare=False)

    def pick(
        self,
        prefill: Sequence[Candidate],
        decode: Sequence[Candidate],
        prompt_tokens: int,
        kv_bytes_per_token: int,
        output_tokens: int = 1,
    ) -> Pair:
        """A random pair (ValueError when a pool is empty)."""
        if prefill and decode:
            prefill, decode = [self.rng.choice(prefill)], [self.rng.choice(decode)]
        return super().pick(prefill, decode, prompt_tokens, kv_bytes_per_token, output_tokens)


def by_node(same: Link, other: Link) -> Callable[[str, str], Link]:
    """``link_between`` for a cluster where instances on one node share
    ``same`` and any two nodes share ``other``."""

    def between(a: str, b: str) -> Link:
        return same if a == b else other

    return between
