"""Model bytes from an S3-compatible store (``s3://BUCKET/KEY``).

The client is botocore's (through boto3), configured the way every AWS tool
is, so a node needs no Galaxy-specific setting: the endpoint of a non-AWS
store (MinIO, Ceph RGW, ...) from ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL``, the region from ``AWS_REGION``/``AWS_DEFAULT_REGION``,
credentials from the usual chain (environment, shared files, instance role).
With no credentials at all the request is sent unsigned, which is what a
public bucket needs. Runs in a thread: boto3 is synchronous.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from controlplane.runtime import models
from controlplane.runtime.errors import FailedPrecondition, Unavailable
from controlplane.runtime.validation import short

#: S3 error codes that no retry will change: the spec names the wrong object.
_PERMANENT = {"NoSuchBucket", "NoSuchKey", "AccessDenied", "InvalidBucketName", "404", "403"}


def download(uri: str, tmp: Path, chunk: int) -> tuple[int, str]:
    """Bytes of the object into tmp: (size, sha256 hex). Unavailable when
    the store cannot be reached or fails; FailedPrecondition when it says the
    object is not there or not ours to read (retrying would not help)."""
    bucket, key = models.s3_location(uri)
    try:  # the `s3` extra: a node without it still serves every other model
        import boto3
        import botocore.exceptions
        from botocore import UNSIGNED
        from botocore.config import Config
    except ImportError:
        raise FailedPrecondition(
            f"model {short(uri)}: this node cannot read s3:// (install galaxy-controlplane[s3])"
        ) from None
    session = boto3.session.Session()
    # Bounds of one request: a store that stops sending fails the fetch (the
    # cache's own fetch timeout bounds the whole download).
    config = Config(
        connect_timeout=10, read_timeout=30, retries={"max_attempts": 3, "mode": "standard"}
    )
    if session.get_credentials() is None:
        config = config.merge(Config(signature_version=UNSIGNED))
    client = session.client("s3", config=config)
    h, size = hashlib.sha256(), 0
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        with tmp.open("wb") as f:
            for piece in body.iter_chunks(chunk):
                h.update(piece)
                f.write(piece)
                size += len(piece)
    except botocore.exceptions.ClientError as e:
        code = str(e.response.get("Error", {}).get("Code", "?"))
        if code in _PERMANENT:
            raise FailedPrecondition(f"model {short(uri)}: the store says {short(code)}") from None
        raise Unavailable(f"model {short(uri)}: the store answered {short(code)}") from None
    except (botocore.exceptions.BotoCoreError, OSError) as e:
        raise Unavailable(f"model {short(uri)}: fetch failed: {short(str(e))}") from None
    finally:
        client.close()
    return size, h.hexdigest()
