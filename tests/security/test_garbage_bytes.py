"""Bytes that do not decode as a method's request are INVALID_ARGUMENT on
every method of every Galaxy server (not UNKNOWN with a traceback)."""

from __future__ import annotations

import logging

import grpc
import pytest
from google.protobuf.descriptor import ServiceDescriptor

from galaxy.v1 import controller_pb2, dispatch_pb2
from tests.security.conftest import ThreadedCluster

# Undecodable as any message: a field tag whose varint never ends, and a
# length-delimited field 1 that claims more bytes than follow.
GARBAGE = [b"\xff\xff\xff\xff\xff", b"\x0a\x7f" + b"ab"]


def _methods(service: ServiceDescriptor) -> list[str]:
    return [f"/{service.full_name}/{m.name}" for m in service.methods]


CASES = [
    ("controller", m) for m in _methods(controller_pb2.DESCRIPTOR.services_by_name["Controller"])
]
CASES += [("dispatch", m) for m in _methods(dispatch_pb2.DESCRIPTOR.services_by_name["Dispatch"])]
CASES += [(who, "/grpc.health.v1.Health/Check") for who in ("controller", "dispatch")]


@pytest.mark.parametrize(("server", "method"), CASES)
def test_garbage_bytes_are_invalid_argument(
    tcluster: ThreadedCluster, server: str, method: str, caplog: pytest.LogCaptureFixture
) -> None:
    address = tcluster.controller if server == "controller" else tcluster.dispatch
    before = tcluster.functions()
    with caplog.at_level(logging.ERROR):
        for data in GARBAGE:
            answer = tcluster.raw(address, method, data)
            assert isinstance(answer, grpc.RpcError), f"{method} accepted garbage"
            assert answer.code() == grpc.StatusCode.INVALID_ARGUMENT, answer
            assert answer.details().startswith("request: ")
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert tcluster.functions() == before
