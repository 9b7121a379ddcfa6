"""Which TLS files a process uses: what the `--tls-dir` / `--insecure`
choice of `galaxy serve` (``RpcConfig``'s flags) resolves to, and the
files a client picks up (pure file checks; the certificates themselves are
made by ``controlplane.runtime.tls``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from controlplane.runtime.config import RpcConfig, to_flags
from controlplane.runtime.tls import ADMIN, TlsConfig

log = logging.getLogger(__name__)

#: Printed by every process that serves or calls without TLS.
INSECURE_WARNING = (
    "INSECURE: plaintext gRPC without authentication; anyone who can reach this "
    "port can deploy code and start or kill instances. For local experiments only."
)


def config(
    identity: str, tls_dir: str | os.PathLike[str] | None, server_name: str | None = None
) -> TlsConfig:
    """identity's files in tls_dir, or ValueError naming what is missing."""
    if not tls_dir:
        raise ValueError("no TLS directory given")
    cfg = TlsConfig.for_identity(Path(tls_dir), identity, server_name or None)
    missing = [str(p) for p in (cfg.ca, cfg.cert, cfg.key) if not p.is_file()]
    if missing:
        raise ValueError(
            f"TLS files missing: {', '.join(missing)}; make them with "
            f"`galaxy certs init --dir {tls_dir} --host HOST`"
        )
    return cfg


def component_tls(
    identity: str, tls_dir: str | None, insecure: bool, server_name: str | None = None
) -> TlsConfig | None:
    """The TLS config of a component from its flags (None: --insecure).
    ValueError with what to do when neither is given or files are missing."""
    if tls_dir and insecure:
        raise ValueError("--tls-dir and --insecure: choose one")
    if insecure:
        log.warning(INSECURE_WARNING)
        return None
    if not tls_dir:
        raise ValueError(
            "no TLS material: give --tls-dir DIR (make one with `galaxy certs init --dir DIR "
            "--host HOST`), set $GALAXY_TLS_DIR, or pass --insecure for a local experiment"
        )
    return config(identity, tls_dir, server_name)


def resolve(rpc: RpcConfig, identity: str) -> RpcConfig:
    """rpc with its credentials loaded from its flags (``tls_dir``,
    ``insecure``, ``tls_server_name``: `galaxy serve KIND`'s) for identity.
    ValueError with what to do when neither TLS nor --insecure is chosen,
    files are missing, or tokens are asked for without TLS."""
    tls = component_tls(identity, rpc.tls_dir, rpc.insecure, rpc.tls_server_name)
    resolved = rpc.replace(tls=tls)
    resolved.tokens_enabled()  # tokens need TLS: refused here, in one line
    return resolved


def client_tls(tls_dir: str | os.PathLike[str] | None) -> TlsConfig | None:
    """A client's TLS config: $GALAXY_TLS_IDENTITY (default client/admin) in
    tls_dir; None when there is no directory (a plaintext control plane)."""
    if not tls_dir:
        return None
    identity = os.environ.get("GALAXY_TLS_IDENTITY", ADMIN)
    return config(identity, tls_dir, os.environ.get("GALAXY_TLS_SERVER_NAME"))


def flags(tls_dir: str | os.PathLike[str] | None) -> list[str]:
    """`galaxy serve` flags for a child: --tls-dir DIR, or --insecure."""
    rpc = RpcConfig(tls_dir=str(tls_dir)) if tls_dir else RpcConfig(insecure=True)
    return to_flags(rpc)
