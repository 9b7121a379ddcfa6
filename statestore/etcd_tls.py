"""TLS (with client certificates) between Galaxy and etcd.

``aetcd`` 1.0 (the asyncio etcd v3 client Galaxy uses) only ever opens a
plaintext channel: ``Client.connect`` calls ``insecure_channel``. etcd itself
serves TLS and can require client certificates (``--client-cert-auth``), so
specs and token hashes need not cross the network in clear. ``TlsClient`` is
``aetcd.Client`` with one difference: its channel is a ``secure_channel`` built
from the files named by ``EtcdTls``. Everything else (stubs, auth token, the
watcher) is set up exactly as aetcd's own ``connect`` does, through aetcd's
public ``rpc`` module.

The files come from the environment, as etcdctl's ``ETCDCTL_CACERT`` /
``ETCDCTL_CERT`` / ``ETCDCTL_KEY`` do, never from the URL (which is printed):

* ``GALAXY_ETCD_CA``: PEM CA bundle that signed etcd's serving certificate
  (unset: the system's roots);
* ``GALAXY_ETCD_CERT`` and ``GALAXY_ETCD_KEY``: the client certificate and its
  key, both or neither (needed when etcd runs with ``--client-cert-auth``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import aetcd
import aetcd.exceptions
import aetcd.rpc
import aetcd.watcher
import grpc

ENV_CA = "GALAXY_ETCD_CA"
ENV_CERT = "GALAXY_ETCD_CERT"
ENV_KEY = "GALAXY_ETCD_KEY"
TLS_ENV = (ENV_CA, ENV_CERT, ENV_KEY)


@dataclass(frozen=True)
class EtcdTls:
    """PEM bytes for a TLS channel to etcd (read once, when the store is opened)."""

    ca: bytes | None
    cert: bytes | None
    key: bytes | None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> EtcdTls:
        """Read the files the ``GALAXY_ETCD_*`` variables name; ValueError
        naming the variable when a file is unreadable or only one of the
        certificate/key pair is set."""
        loaded: dict[str, bytes | None] = {}
        for var in TLS_ENV:
            path = env.get(var) or None
            if path is None:
                loaded[var] = None
                continue
            try:
                loaded[var] = Path(path).read_bytes()
            except OSError as e:
                raise ValueError(f"{var}: cannot read {path}: {e.strerror}") from None
        if (loaded[ENV_CERT] is None) != (loaded[ENV_KEY] is None):
            missing = ENV_KEY if loaded[ENV_CERT] is not None else ENV_CERT
            raise ValueError(f"etcd client certificate: {missing} is not set")
        return cls(ca=loaded[ENV_CA], cert=loaded[ENV_CERT], key=loaded[ENV_KEY])

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials (server verified; client cert when given)."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )


def tls_env_set(env: Mapping[str, str]) -> list[str]:
    """The ``GALAXY_ETCD_*`` TLS variables that are set (non-empty)."""
    return [var for var in TLS_ENV if env.get(var)]


class TlsClient(aetcd.Client):  # type: ignore[misc]
    """``aetcd.Client`` over a TLS channel (see the module docstring)."""

    def __init__(self, *args: object, tls: EtcdTls, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._tls = tls

    async def connect(self) -> None:
        """Open the TLS channel and the stubs (aetcd's ``connect``, secure)."""
        if self._connected.is_set():
            return
        if self._is_connecting:  # type: ignore[has-type]
            # Another task is connecting: wait for it, as aetcd does.
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            target = f"{self._host}:{self._port}"
            self.channel = aetcd.rpc.secure_channel(
                target, self._tls.credentials(), options=self._options.items()
            )
            if self._username is not None and self._password is not None:
                self.auth_stub = aetcd.rpc.AuthStub(self.channel)
                request = aetcd.rpc.AuthenticateRequest(
                    name=self._username, password=self._password
                )
                try:
                    resp = await self.auth_stub.Authenticate(request, timeout=self._timeout)
                except grpc.aio.AioRpcError as e:
                    # aetcd maps gRPC errors to its exceptions in a decorator
                    # on its own connect; do the same for ours (aetcd is
                    # pinned below 2, so this helper's shape is stable).
                    aetcd.exceptions._handle_exception(e)
                    raise
                self.metadata = (("token", resp.token),)
            self.kvstub = aetcd.rpc.KVStub(self.channel)
            self.clusterstub = aetcd.rpc.ClusterStub(self.channel)
            self.leasestub = aetcd.rpc.LeaseStub(self.channel)
            self.maintenancestub = aetcd.rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd.watcher.Watcher(
                aetcd.rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        finally:
            self._is_connecting = False
