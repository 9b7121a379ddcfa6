"""``Res`` arithmetic shares equal results (``capacity.interned``): the
values, their types and the Res API are those of plain construction."""

import random

import pytest

from controlplane.runtime import resources as capacity
from controlplane.runtime.resources import Res, interned


def plain(c, m, g) -> tuple:
    """What a fresh Res(c, m, g) holds: the components with their types."""
    r = Res(c, m, g)
    return tuple((type(v), v) for v in (r.cpu_millis, r.memory_mib, r.gpus))


def held(r: Res) -> tuple:
    return tuple((type(v), v) for v in (r.cpu_millis, r.memory_mib, r.gpus))


@pytest.mark.parametrize("seed", range(5))
def test_arithmetic_equals_plain_construction(seed, monkeypatch):
    monkeypatch.setattr(capacity, "_INTERNED_MAX", 64)  # clear often too
    rng = random.Random(seed)
    pool = [Res(rng.randrange(-500, 4000), rng.randrange(-256, 8192), rng.randrange(3))]
    for _ in range(5000):
        a, b = rng.choice(pool), rng.choice(pool)
        op = rng.random()
        if op < 0.4:
            r, want = a + b, plain(a.cpu_millis + b.cpu_millis, a.memory_mib + b.memory_mib,
                                   a.gpus + b.gpus)  # fmt: skip
        elif op < 0.8:
            r, want = a - b, plain(a.cpu_millis - b.cpu_millis, a.memory_mib - b.memory_mib,
                                   a.gpus - b.gpus)  # fmt: skip
        else:
            r = a.clamped()
            want = plain(max(a.cpu_millis, 0), max(a.memory_mib, 0), max(a.gpus, 0))
        assert type(r) is Res and held(r) == want
        assert r == Res(*(v for _, v in want)) and hash(r) == hash(Res(*(v for _, v in want)))
        if len(pool) < 200 or rng.random() < 0.1:
            pool.append(r)
    assert len(capacity._INTERNED) <= 64


def test_only_whole_ints_are_shared():
    assert interned(1, 2, 0) is interned(1, 2, 0)
    # Equal to (1, 2, 0) as keys, but a Res of floats or bools keeps them.
    f = interned(1.0, 2, 0)
    assert held(f) == ((float, 1.0), (int, 2), (int, 0)) and str(f).startswith("1.0m")
    b = interned(True, 2, 0)
    assert type(b.cpu_millis) is bool
    assert held(Res(0.5, 1, 0) + Res(0.5, 1, 0)) == ((float, 1.0), (int, 2), (int, 0))
