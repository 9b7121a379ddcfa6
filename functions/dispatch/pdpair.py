"""The prefill half of a disaggregated LLM request: which prefill instance
pairs with the decode instance already granted (pure: no I/O).

A disaggregated function (``FunctionSpec.pd``) is served in two grants. The
gateway first gets a decode instance from the function's owner as for any
LLM request (the LLM picker: queue, KV use, prefix affinity); that answer
names the prefill function (``InstanceAddr.pd``). It then asks the prefill
function's owner for an instance with ``RoutingHint.decode_node`` set: the
owner pairs one of its free prefill instances with that node by
``disagg.PairPicker``'s estimate, the prefill queue ahead of the prompt plus
the KV transfer over the link between the two nodes, so a same-node
prefill instance wins unless its queue costs more than the slower link.

Both owners decide alone (the design's "the function's owner decides"): the
decode owner knows nothing of the prefill pool and the prefill owner only
the decode instance's node, which is all the link depends on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from controlplane.runtime.disagg import LINKS, Candidate, Link, Pair, PairPicker, by_node
from controlplane.runtime.llmsignals import Load
from functions.dispatch.policy import Instance
from galaxy.v1 import dispatch_pb2

#: Estimates when the decode function's spec gives none (a spec should:
#: they are its model's). KV: Gemma 3 270M's configuration, 18 layers x K
#: and V x 256 x 2 bytes a token within its window; prefill: an assumption
#: of the order of a small model on a CPU (the fitted profile's is 450/s,
#: vLLM's SmolLM2-135M here 2,000/s).
DEFAULT_KV_BYTES_PER_TOKEN = 18_432
DEFAULT_PREFILL_TPS = 2_000.0


#: the link KV bytes take between two nodes (same node: a Unix socket)
DEFAULT_LINKS = by_node(LINKS["same-node"], LINKS["tcp"])


@dataclass(frozen=True)
class PrefillPairing:
    """Chooses a prefill instance for a decode on a given node."""

    link_between: Callable[[str, str], Link] = DEFAULT_LINKS

    def choose(
        self,
        free: Iterable[Instance],
        loads: Callable[[str], Load | None],
        hint: dispatch_pb2.RoutingHint,
    ) -> Pair | None:
        """The pair for one request among the prefill instances with a free
        slot (None when there is none). The requests ahead on an instance
        are its scraped waiting and running ones, or the requests in flight
        there when more (those sent since the scrape), each counted as a
        prompt as long as this one (the signals carry requests, not tokens);
        running ones count because every engine iteration decodes them too.
        A scrape sent before a slot of the instance came back is not used:
        it counts a request that has ended (sequential requests found the
        same-node instance "busy" with the previous one and crossed nodes)."""
        tokens = max(1, hint.prompt_tokens)
        cands = []
        for inst in free:
            load = loads(inst.instance_id)
            scraped = 0
            if load is not None and load.at >= inst.released_at:
                scraped = load.sample.waiting + load.sample.running
            ahead = max(inst.in_flight, scraped)
            cands.append(Candidate(inst.instance_id, inst.node_id, ahead * tokens))
        if not cands:
            return None
        picker = PairPicker(
            self.link_between, hint.pd.prefill_tps or DEFAULT_PREFILL_TPS, decode_s_per_seq=0.0
        )
        decode = [Candidate("decode", hint.decode_node)]
        per_token = hint.pd.kv_bytes_per_token or DEFAULT_KV_BYTES_PER_TOKEN
        return picker.pick(cands, decode, tokens, per_token)
