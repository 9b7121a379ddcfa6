"""A start that uses a capacity credit picks its node with the scoring terms
Schedule places with (controlplane/runtime/scoring.py): the credits say
where capacity is reserved for this Dispatch, the term ranks those nodes. A
term registered here, and named in DispatchConfig.scoring as an operator
would, changes which node a credit start goes to."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from controlplane.runtime import scoring
from controlplane.runtime.clock import ManualClock
from controlplane.runtime.credits import Grant
from controlplane.runtime.resources import Res
from controlplane.runtime.scoring import NodeInfo
from functions.dispatch.config import DispatchConfig
from functions.dispatch.credits import CreditWallet

SLICE = Res(1000, 1024)
NEED = Res(100, 128)


@scoring.register("test_fullest_first")
def fullest_first(node: NodeInfo, free: Res, need: Res, function: str = "") -> float:
    """Bin packing: the node with the least left after the start scores best."""
    return -scoring.least_loaded(node, free, need, function)


@scoring.register("test_by_function")
def by_function(node: NodeInfo, free: Res, need: Res, function: str = "") -> float:
    """Locality: function ``f-b`` prefers node ``nb`` (a cache there, say)."""
    return 1.0 if (function, node.node_id) == ("f-b", "nb") else 0.0


def wallet(term: str) -> CreditWallet:
    """A wallet made the way functions/dispatch/main.py makes it."""
    cfg = DispatchConfig(scoring=term)
    w = CreditWallet(target=2, renew_s=1.0, idle_s=30.0, score=scoring.lookup(cfg.scoring),
                     clock=ManualClock())  # fmt: skip
    w.home = "s1"
    req = w.begin_sync("s1")
    w.end_sync(req, [Grant("a", "na", "agent-a", SLICE, 10.0),
                     Grant("b", "nb", "agent-b", SLICE, 10.0)])  # fmt: skip
    return w


def settle_on(w: CreditWallet, node: str) -> None:
    """Use one credit once, its start settled: that node now has less left."""
    use = w.take(NEED)
    assert use is not None and use.node_id == node
    w.settled(use, node_seq=1)


def test_the_default_term_spreads_and_a_registered_term_packs() -> None:
    spread = wallet("least_loaded")
    settle_on(spread, "na")  # a tie: the first credit
    nxt = spread.take(NEED)
    assert nxt is not None and nxt.node_id == "nb"  # the emptier node
    packed = wallet("test_fullest_first")
    settle_on(packed, "na")
    nxt = packed.take(NEED)
    assert nxt is not None and nxt.node_id == "na"  # the fuller node


def test_a_term_sees_the_function_being_started() -> None:
    w = wallet("test_by_function")
    use = w.take(NEED, "f-b")
    assert use is not None and use.node_id == "nb"
    w.settled(use, node_seq=1)
    other = w.take(NEED, "f-a")
    assert other is not None and other.node_id == "na"


def test_an_unknown_term_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValidationError) as e:
        DispatchConfig(scoring="nope")
    assert "scoring" in str(e.value) and "unknown scoring term" in str(e.value)
