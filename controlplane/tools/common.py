"""What the `galaxy` commands share: user-facing errors and finding the
control plane to talk to."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controlplane.launch.endpoints import read_endpoints
from controlplane.runtime import credentials, tlsfiles
from controlplane.runtime.tls import TlsConfig

if TYPE_CHECKING:
    from controlplane.sdk.client import GalaxyClient


class CliError(Exception):
    """A user-facing error: printed without a traceback, exit code 1."""


def find_controller(args: argparse.Namespace) -> str:
    """--controller, else $GALAXY_CONTROLLER, else the running `galaxy up`."""
    if getattr(args, "controller", None):
        return str(args.controller)
    if os.environ.get("GALAXY_CONTROLLER"):
        return os.environ["GALAXY_CONTROLLER"]
    ep = read_endpoints(Path(args.run_dir))
    if ep and ep.get("controller"):
        return str(ep["controller"])
    raise CliError(
        f"no running control plane found in {args.run_dir}; start one with `galaxy up` "
        "or pass --controller HOST:PORT"
    )


def find_tls(args: argparse.Namespace) -> TlsConfig | None:
    """The client certificate to use: $GALAXY_TLS_DIR (identity
    $GALAXY_TLS_IDENTITY, default client/admin), else the running `galaxy
    up`'s; None when neither exists (a plaintext control plane)."""
    tls_dir = os.environ.get("GALAXY_TLS_DIR")
    if not tls_dir:
        ep = read_endpoints(Path(args.run_dir)) or {}
        tls_dir = ep.get("tls_dir")
    try:
        return tlsfiles.client_tls(tls_dir)
    except ValueError as e:
        raise CliError(str(e)) from None


def find_token(args: argparse.Namespace) -> str | None:
    """The bearer token to send: $GALAXY_TOKEN, $GALAXY_TOKEN_FILE, else
    the running `galaxy up`'s admin token; None when there is none."""
    try:
        return credentials.client_token(read_endpoints(Path(args.run_dir)))
    except ValueError as e:
        raise CliError(str(e)) from None


def connect(args: argparse.Namespace, **kwargs: Any) -> GalaxyClient:
    """A client of the control plane the command targets (see
    find_controller, find_tls and find_token)."""
    from controlplane.sdk.client import GalaxyClient

    kwargs.setdefault("token", find_token(args))
    return GalaxyClient(find_controller(args), tls=find_tls(args), **kwargs)
