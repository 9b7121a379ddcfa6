"""``experiment.stdev`` is ``statistics.stdev`` bit for bit (the exact sums
taken in integers with numpy), and ``summarize`` gives the same summary for
a sorted array of doubles (used as it is) as for a list."""

from __future__ import annotations

import math
import random
import statistics
from array import array
from fractions import Fraction

import pytest

from controlplane.bench import experiment as ex


def samples(rng: random.Random, kind: int, n: int) -> list[float]:
    if kind == 0:  # latencies
        return [rng.expovariate(200.0) for _ in range(n)]
    if kind == 1:  # both signs
        return [rng.gauss(0.0, 1.0) for _ in range(n)]
    if kind == 2:  # extreme and subnormal magnitudes, zeros
        pick = [0.0, 5e-324, 1e-310, 1e-300, 1e300, -2.5, 1.0]
        return [rng.choice(pick) * rng.random() for _ in range(n)]
    if kind == 3:  # all equal
        return [0.1] * n
    if kind == 4:  # large values, tiny spread
        return [1e9 + rng.random() * 1e-6 for _ in range(n)]
    return [math.ldexp(rng.random(), rng.randint(-1074, 1000)) for _ in range(n)]


@pytest.mark.parametrize("kind", range(6))
@pytest.mark.parametrize("seed", range(8))
def test_stdev_is_statistics_stdev_bit_for_bit(kind, seed):
    rng = random.Random(seed * 10 + kind)
    xs = samples(rng, kind, rng.choice([1000, 1001, 4096, 7000]))
    want = statistics.stdev(xs)
    assert ex.stdev(xs).hex() == want.hex()
    assert ex.stdev(array("d", xs)).hex() == want.hex()
    assert ex.stdev(array("d", sorted(xs))).hex() == want.hex()


def test_more_than_one_chunk():
    rng = random.Random(7)
    xs = array("d", (rng.expovariate(100.0) for _ in range(ex._CHUNK + 12345)))
    assert ex.stdev(xs) == statistics.stdev(xs)


def test_other_types_and_non_finite_values_go_to_statistics():
    assert ex.stdev(list(range(2000))) == statistics.stdev(list(range(2000)))
    fr = [Fraction(i, 7) for i in range(1500)]
    assert ex.stdev(fr) == statistics.stdev(fr)
    xs = [1.0] * 1500 + [math.inf]

    def outcome(f):
        try:
            return f(xs)
        except Exception as e:  # statistics.stdev fails on inf in 3.11
            return type(e)

    assert outcome(ex.stdev) == outcome(statistics.stdev)


@pytest.mark.parametrize("seed", range(3))
def test_sqrt_of_ratio_is_correctly_rounded(seed):
    rng = random.Random(seed)
    for _ in range(3000):
        num = rng.getrandbits(rng.randint(1, 400)) or 1
        den = rng.getrandbits(rng.randint(1, 400)) or 1
        r = ex._sqrt_of_ratio(num, den)
        # Correct rounding: the exact root lies within half an ulp of r
        # (checked in rationals: (r -+ ulp/2)**2 brackets num/den).
        q = Fraction(num, den)
        half = Fraction(math.ulp(r)) / 2
        assert (Fraction(r) - half) ** 2 <= q <= (Fraction(r) + half) ** 2
    assert ex._sqrt_of_ratio(0, 5) == 0.0 and ex._sqrt_of_ratio(9, 4) == 1.5


@pytest.mark.parametrize("n", [0, 1, 2, 999, 1000, 5000])
def test_summarize_a_sorted_array_as_a_list(n):
    rng = random.Random(n)
    xs = sorted(rng.expovariate(50.0) for _ in range(n))
    assert ex.summarize(array("d", xs)) == ex.summarize(xs) == ex.summarize(xs[::-1])
    unsorted = array("d", xs[::-1])
    assert ex.summarize(unsorted) == ex.summarize(xs)
