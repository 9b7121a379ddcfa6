"""Bearer-token records in the state store (``/galaxy/tokens/ID``).

Each record is JSON with the token's public id, name, role, namespace and
the SHA-256 of its secret; the secret itself is never stored or logged
(``controlplane.runtime.access``). Writes are synchronous: a token is usable
once CreateToken answers. The controller verifies tokens through a cache
(``authn.Authenticator``) in front of ``lookup``; a delete here drops the
controller's entry at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

from controlplane.runtime import access, validation
from controlplane.runtime.errors import (
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from controlplane.runtime.validation import short
from statestore import KV, StateStore, StoreUnavailable

log = logging.getLogger(__name__)

PREFIX = "/galaxy/tokens/"
#: Tokens the cluster holds at most (each is one small record).
MAX_TOKENS = 10_000
NAME_MAX = 100
#: The name of the admin token read from --bootstrap-token-file.
BOOTSTRAP_NAME = "bootstrap"


def check_request(name: str, role: str, namespace: str) -> None:
    """The rules of CreateToken's fields (also used by the CLI)."""
    if not name or len(name) > NAME_MAX or not name.isprintable():
        raise InvalidArgument(f"name: 1-{NAME_MAX} printable characters, got {short(name)}")
    if role not in access.ROLES:
        raise InvalidArgument(f"role: one of {', '.join(access.ROLES)}, got {short(role)}")
    if role == access.ADMIN:
        if namespace:
            raise InvalidArgument(
                "namespace: an admin token acts on every namespace; leave it empty"
            )
    else:
        if not namespace:
            raise InvalidArgument(f"namespace: required for role {role}")
        validation.check_name("namespace", namespace)


def encode(rec: access.TokenRecord) -> bytes:
    """The stored JSON of a record."""
    return json.dumps(
        {
            "id": rec.id,
            "name": rec.name,
            "role": rec.role,
            "namespace": rec.namespace,
            "sha256": rec.sha256,
            "created_unix": rec.created_unix,
        },
        sort_keys=True,
    ).encode()


def decode(raw: bytes) -> access.TokenRecord | None:
    """A record, or None for a value that is not one (never raises)."""
    try:
        d = json.loads(raw)
        return access.TokenRecord(
            str(d["id"]),
            str(d["name"]),
            str(d["role"]),
            str(d.get("namespace", "")),
            str(d["sha256"]),
            float(d.get("created_unix", 0.0)),
        )
    except (ValueError, KeyError, TypeError):
        return None


class TokenStore:
    """Create, list, revoke and look up tokens in the state store."""

    def __init__(self, store: StateStore, max_tokens: int = MAX_TOKENS) -> None:
        self.store = store
        self.max_tokens = max_tokens

    async def create(self, name: str, role: str, namespace: str) -> tuple[str, access.TokenRecord]:
        """A new token (returned once) and its stored record."""
        check_request(name, role, namespace)
        existing = await self._kvs()
        if len(existing) >= self.max_tokens:
            raise ResourceExhausted(f"tokens: at most {self.max_tokens}; delete unused ones")
        token, rec = access.new_token(name, role, namespace, now_unix=time.time())
        await self._put(rec)
        log.info("token %s created for %s (%s)", rec.id, short(name), role)
        return token, rec

    async def bootstrap(self, path: Path) -> None:
        """Make the admin token in path valid (its hash stored), so an
        operator (or `galaxy up`) who put a token there can start. The file
        holds the token itself; it is read, never written, here."""
        token = (await asyncio.to_thread(path.read_text)).strip()
        parsed = access.parse(token)
        if parsed is None:
            raise SystemExit(f"galaxy: {path}: not a Galaxy token (glx_<16 hex>_<secret>)")
        tid, secret = parsed
        current = await self.lookup(tid)
        if current is not None and access.matches(current, secret) and current.role == access.ADMIN:
            return
        rec = access.TokenRecord(
            tid, BOOTSTRAP_NAME, access.ADMIN, "", access.digest(secret), time.time()
        )
        await self._put(rec)
        log.info("bootstrap admin token %s registered from %s", tid, path)
        # One bootstrap token at a time: each `galaxy up` on a shared store
        # brings a new one, and the one it replaces must stop working rather
        # than pile up as a forgotten admin credential.
        for old in await self.records():
            if old.name == BOOTSTRAP_NAME and old.id != tid:
                await self.delete(old.id)
                log.warning("bootstrap admin token %s replaced by %s: revoked", old.id, tid)

    async def records(self) -> list[access.TokenRecord]:
        """Every token's record, by id."""
        recs = [decode(kv.value) for kv in await self._kvs()]
        return sorted((r for r in recs if r is not None), key=lambda r: r.id)

    async def delete(self, token_id: str) -> None:
        """Revoke a token, or NotFound."""
        if not token_id or len(token_id) > 64 or not token_id.isalnum():
            raise InvalidArgument(f"id: the 16 hex digits after glx_, got {short(token_id)}")
        try:
            deleted = await self.store.delete(PREFIX + token_id)
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable, token not deleted: {e}") from e
        if not deleted:
            raise NotFound(f"token {short(token_id)} not found")
        log.info("token %s revoked", token_id)

    async def lookup(self, token_id: str) -> access.TokenRecord | None:
        """The record of token_id, None when there is none."""
        if not token_id.isalnum() or len(token_id) > 64:
            return None
        try:
            kv = await self.store.get(PREFIX + token_id)
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable, cannot verify a token: {e}") from e
        return None if kv is None else decode(kv.value)

    async def _put(self, rec: access.TokenRecord) -> None:
        try:
            await self.store.put(PREFIX + rec.id, encode(rec))
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable, token not saved: {e}") from e

    async def _kvs(self) -> list[KV]:
        try:
            return await self.store.get_prefix(PREFIX)
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable: {e}") from e
