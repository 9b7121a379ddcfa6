"""The SDK's retry policy and typed errors (pure parts)."""

from __future__ import annotations

import random

import grpc
import pytest

from controlplane.runtime.errors import (
    GalaxyError,
    NotFound,
    PermissionDenied,
    Unavailable,
    from_rpc_error,
)
from controlplane.sdk.retry import Backoff


def test_backoff_is_jittered_capped_and_bounded() -> None:
    b = Backoff(base_s=0.1, cap_s=0.4, max_attempts=5, rng=random.Random(1))
    delays = [b.delay(n, now=0.0, deadline=100.0) for n in range(1, 5)]
    assert all(d is not None for d in delays)
    assert [d <= c for d, c in zip(delays, [0.1, 0.2, 0.4, 0.4], strict=True)] == [True] * 4
    assert b.delay(5, now=0.0, deadline=100.0) is None  # attempts used up
    # No retry that could not start well before the deadline.
    assert b.delay(1, now=99.99, deadline=100.0) is None


def test_full_jitter_spreads_clients_that_failed_together() -> None:
    draws = {round(Backoff(base_s=1.0, cap_s=1.0, rng=random.Random(s)).delay(1, 0, 10) or 0, 3)
             for s in range(20)}  # fmt: skip
    assert len(draws) > 15


class _Err(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    "code, cls",
    [
        (grpc.StatusCode.UNAVAILABLE, Unavailable),
        (grpc.StatusCode.NOT_FOUND, NotFound),
        (grpc.StatusCode.PERMISSION_DENIED, PermissionDenied),
    ],
)
def test_rpc_errors_become_typed_galaxy_errors(code: grpc.StatusCode, cls: type) -> None:
    e = from_rpc_error(_Err(code, "why"))
    assert isinstance(e, cls) and e.code == code and e.message == "why"


def test_an_unlisted_code_keeps_its_code() -> None:
    e = from_rpc_error(_Err(grpc.StatusCode.ABORTED, "raced"))
    assert type(e) is GalaxyError and e.code == grpc.StatusCode.ABORTED
