"""Models from an S3-compatible store on another host (a network namespace).

No real S3 server installs here (MinIO is not packaged for Debian or PyPI;
Ceph's RGW needs a RADOS cluster), so the store is **moto's S3 server, an
emulator**, run as its own process on another host; the client side is the
real one users run (botocore), configured only through the standard AWS
variables (``AWS_ENDPOINT_URL``), so the same node reads MinIO, Ceph RGW or
AWS S3 unchanged.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from controlplane.nodeagent.modelcache import ModelCache, Tier
from controlplane.runtime import models
from controlplane.runtime.errors import FailedPrecondition, InvalidArgument, Unavailable
from galaxy.v1 import common_pb2
from tests.netns import Hosts, require_netns

pytestmark = pytest.mark.slow

KIB = 1024
BUCKET = "models"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on another host; its URL once it answers."""
    require_netns()
    hosts = Hosts().create(1)
    try:
        ip = hosts.ip(0)
        port = 9000
        proc = subprocess.Popen(
            [*hosts.exec_prefix(0), sys.executable, "-m", "moto.server", "-H", ip, "-p",
             str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert proc.stderr is not None
            # werkzeug announces the socket once it listens: await that line.
            for line in proc.stderr:
                if "Running on" in line:
                    break
            else:
                pytest.fail(f"moto's S3 server exited with {proc.wait()}")
            yield f"http://{ip}:{port}"
        finally:
            proc.kill()
            proc.wait(timeout=10)
    finally:
        hosts.close()


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "galaxy-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "galaxy-test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    return s3_endpoint


def _put(name: str, size: int) -> tuple[common_pb2.ModelRef, bytes]:
    data = os.urandom(size)
    boto3.client("s3").put_object(Bucket=BUCKET, Key=name, Body=data)
    sha = hashlib.sha256(data).hexdigest()
    return common_pb2.ModelRef(uri=f"s3://{BUCKET}/{name}", sha256=sha, size_bytes=size), data


def _cache(tmp_path: Path) -> ModelCache:
    return ModelCache([Tier("disk", tmp_path / "disk", 64 * 1024 * KIB)])


async def test_a_model_comes_from_s3_once_for_concurrent_starts(s3_env, tmp_path) -> None:
    ref, data = _put("dir/m.bin", 512 * KIB)
    cache = _cache(tmp_path)
    got = await asyncio.gather(*(cache.acquire(ref) for _ in range(4)))
    assert {p for p, _ in got} == {tmp_path / "disk" / ref.sha256}
    assert (tmp_path / "disk" / ref.sha256).read_bytes() == data
    assert got[0][1].pins == 4  # one fetch, four holders


async def test_a_missing_object_or_a_wrong_checksum_never_starts(s3_env, tmp_path) -> None:
    cache = _cache(tmp_path)
    with pytest.raises(FailedPrecondition, match="NoSuchKey"):
        await cache.acquire(common_pb2.ModelRef(uri=f"s3://{BUCKET}/nosuch.bin"))
    with pytest.raises(FailedPrecondition, match="NoSuchBucket"):
        await cache.acquire(common_pb2.ModelRef(uri="s3://nosuch-bucket/m.bin"))
    ref, _ = _put("bad.bin", 16 * KIB)
    ref.sha256 = hashlib.sha256(b"other").hexdigest()
    with pytest.raises(FailedPrecondition, match="sha256 mismatch"):
        await cache.acquire(ref)
    assert os.listdir(tmp_path / "disk") == []


async def test_an_unreachable_store_is_unavailable(monkeypatch, tmp_path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with pytest.raises(Unavailable, match="fetch failed"):
        await _cache(tmp_path).acquire(common_pb2.ModelRef(uri=f"s3://{BUCKET}/m.bin"))


@pytest.mark.parametrize(
    ("uri", "named"),
    [("s3:///key", "bucket"), ("s3://bucket", "object key"), ("s3://bucket/", "object key")],
)
def test_an_s3_uri_without_bucket_or_key_is_refused(uri: str, named: str) -> None:
    with pytest.raises(InvalidArgument, match=f"model.uri: .*{named}"):
        models.check(common_pb2.ModelRef(uri=uri))
