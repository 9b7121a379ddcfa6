"""Bootstrap admin tokens are replaced, not accumulated: a controller started
with a new --bootstrap-token-file (each `galaxy up` makes one) revokes the
bootstrap token it replaces; the same file again changes nothing; tokens
made with `galaxy tokens create` are never touched."""

from __future__ import annotations

from pathlib import Path

from controlplane.controller.tokens_store import BOOTSTRAP_NAME, TokenStore
from controlplane.runtime import access, credentials
from statestore import MemoryStore


def _token_file(path: Path) -> tuple[Path, str]:
    credentials.ensure_token_file(path)
    token = path.read_text().strip()
    parsed = access.parse(token)
    assert parsed is not None
    return path, parsed[0]


async def test_a_new_bootstrap_token_revokes_the_one_it_replaces(tmp_path: Path) -> None:
    tokens = TokenStore(MemoryStore())
    _, kept = await tokens.create("ci", access.ADMIN, "")
    first, first_id = _token_file(tmp_path / "a")
    await tokens.bootstrap(first)
    await tokens.bootstrap(first)  # a restart with the same file
    assert [r.id for r in await tokens.records() if r.name == BOOTSTRAP_NAME] == [first_id]

    second, second_id = _token_file(tmp_path / "b")
    await tokens.bootstrap(second)
    records = await tokens.records()
    assert [r.id for r in records if r.name == BOOTSTRAP_NAME] == [second_id]
    assert await tokens.lookup(first_id) is None
    assert kept.id in {r.id for r in records}
