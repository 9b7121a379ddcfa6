"""A prompt's leading-block hashes: what prefix-cache affinity keys on.

Shared by the emulated LLM server (``controlplane.llm``), which caches
prompts by these hashes, and by the gateway, which sends a request's
leading ones to Dispatch as a routing hint (``DispatchRequest.hint``) so the
function's owner can pick the instance holding the prefix
(``controlplane.runtime.llmpicker``). Pure.

Tokens are whitespace-separated words (a chat message is its role and its
content's words), in blocks of ``BLOCK_TOKENS``, hashed chained: a block's
hash covers every token before it, so equal hashes mean equal prefixes.
For a real model's tokenizer these are not its blocks, but they still key
the approximate index (which instance was sent which prefix), which is all
the picker needs of them there.
"""

from __future__ import annotations

import hashlib
from typing import Any

#: tokens per block (vLLM's default block size)
BLOCK_TOKENS = 16
#: at most this many leading blocks go in a routing hint (1,024 tokens):
#: enough to tell shared system prompts apart, bounded per request
HINT_BLOCKS = 64
#: a hint's block ids longer than this are cut (a trace's ids are short)
BLOCK_ID_MAX = 32


def block_hashes(tokens: list[str], block: int, limit: int | None = None) -> tuple[str, ...]:
    """Chained hashes of the full blocks of a token list (at most ``limit``
    leading ones)."""
    out: list[str] = []
    h = hashlib.sha256()
    full = len(tokens) - len(tokens) % block
    if limit is not None:
        full = min(full, limit * block)
    for i in range(0, full, block):
        h.update("\x1f".join(tokens[i : i + block]).encode())
        out.append(h.copy().hexdigest()[:16])
    return tuple(out)


def _text(content: Any) -> str | None:
    """A message's text: a string, or the ``text`` parts of a list of parts
    (OpenAI's other form); None for anything else."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and len(content) <= 1024:
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if all(isinstance(t, str) for t in texts):
            return " ".join(str(t) for t in texts)
    return None


def chat_words(messages: list[Any]) -> list[str] | int:
    """The words of a chat's messages (role then content), or the index of
    the first message that is not ``{role, content}`` with text content."""
    words: list[str] = []
    for i, m in enumerate(messages):
        text = _text(m.get("content", "")) if isinstance(m, dict) else None
        if text is None:
            return i
        words += [str(m.get("role", "user")) + ":", *text.split()]
    return words


def hint_blocks(body: Any, limit: int = HINT_BLOCKS) -> tuple[str, ...]:
    """The leading block hashes of an OpenAI completion body (chat
    ``messages`` or ``prompt``), or the ids a replayed trace gives in
    ``galaxy_prefix_blocks``; () for a body they cannot be read from (the
    instance answers its errors: routing only needs a best effort)."""
    if not isinstance(body, dict):
        return ()
    given = body.get("galaxy_prefix_blocks")
    if isinstance(given, list):
        return tuple(str(b)[:BLOCK_ID_MAX] for b in given[:limit])
    msgs = body.get("messages")
    if isinstance(msgs, list):
        words = chat_words(msgs)
        return () if isinstance(words, int) else block_hashes(words, BLOCK_TOKENS, limit)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return block_hashes(prompt.split(), BLOCK_TOKENS, limit)
    return ()
