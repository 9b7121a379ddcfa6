"""Bearer-token files: the one `galaxy up` makes, and the one a client
picks up (``$GALAXY_TOKEN``, ``$GALAXY_TOKEN_FILE``, or the running
`galaxy up`'s ``token_file``), so the CLI and tools find the admin token
by themselves, as they find the certificates."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from controlplane.runtime import access

#: Where `galaxy up` keeps its admin token, in the run directory.
TOKEN_FILE = "token"


def generate_admin_token() -> str:
    """A new token to be registered as an admin's (by the controller's
    --bootstrap-token-file, which stores only its hash)."""
    token, _ = access.new_token("bootstrap", access.ADMIN, "")
    return token


def ensure_token_file(path: Path) -> str:
    """The token in path, made (mode 0600, atomically) when missing or not
    a token."""
    try:
        token = path.read_text().strip()
        if access.parse(token) is not None:
            path.chmod(0o600)
            return token
    except FileNotFoundError:
        pass
    token = generate_admin_token()
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)
    return token


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token in a file; ValueError naming the file when there is none."""
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise ValueError(f"token file {path}: {e.strerror or e}") from None
    if access.parse(token) is None:
        raise ValueError(f"token file {path}: not a Galaxy token (glx_<16 hex>_<secret>)")
    return token


def client_token(endpoints: dict[str, Any] | None) -> str | None:
    """The token a client sends: $GALAXY_TOKEN, else the file
    $GALAXY_TOKEN_FILE, else the running `galaxy up`'s; None when there is
    none (a cluster without tokens). ValueError for an unusable file."""
    env = os.environ.get("GALAXY_TOKEN", "").strip()
    if env:
        return env
    path = os.environ.get("GALAXY_TOKEN_FILE") or (endpoints or {}).get("token_file")
    return read_token_file(path) if path else None
