"""The real model's KV state as bytes: what a prefill instance of llama.cpp
exports after evaluating a prompt and a decode instance imports to continue.

The bytes are llama.cpp's own per-sequence state (``llama_state_seq_get_data``
of sequence 0: the KV cells of the prompt's tokens, no logits and no sampler),
behind a small header that carries the prompt's token ids, because the
importer must know which tokens the cells stand for to continue after them:

    b"GKV1" | uint32 n_tokens | n_tokens x int32 token ids | state bytes

The importer places the cells in its own context and sets its token history
to the ids, so llama-cpp-python's prefix match sees the whole prompt as
already evaluated: it re-evaluates only the last prompt token (to get the
logits to sample the first new token from) and decodes on from there.
"""

from __future__ import annotations

import ctypes
import mmap
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # llama_cpp is an optional extra; only its objects are passed in
    from llama_cpp import Llama

MAGIC = b"GKV1"
_HEAD = struct.Struct("<4sI")
SEQ = 0


class BadState(ValueError):
    """Bytes that are not a state this instance can import (the message says why)."""


@dataclass(frozen=True)
class Exported:
    """A prompt's state, ready to send."""

    tokens: int
    data: bytes


def pack(tokens: list[int], state: bytes) -> bytes:
    """The wire form of a sequence's state and the tokens it covers."""
    ids = struct.pack(f"<{len(tokens)}i", *tokens)
    return _HEAD.pack(MAGIC, len(tokens)) + ids + state


def unpack(blob: bytes | bytearray | mmap.mmap, n_ctx: int) -> tuple[list[int], memoryview]:
    """The token ids and the llama.cpp state of a wire blob (BadState when
    the header is wrong or the prompt does not fit a context of n_ctx)."""
    if len(blob) < _HEAD.size:
        raise BadState(f"KV state: {len(blob)} bytes, shorter than its header")
    magic, n = _HEAD.unpack_from(blob)
    if magic != MAGIC:
        raise BadState("KV state: not a Galaxy llama.cpp state (bad magic)")
    if not 0 < n < n_ctx:
        raise BadState(f"KV state: {n} tokens, this instance's context holds {n_ctx}")
    end = _HEAD.size + 4 * n
    if len(blob) <= end:
        raise BadState(f"KV state: {len(blob)} bytes, too short for {n} token ids and a state")
    tokens = list(struct.unpack_from(f"<{n}i", blob, _HEAD.size))
    return tokens, memoryview(blob)[end:]


def export(llm: Llama, tokens: list[int]) -> Exported:
    """Evaluate the prompt from an empty context (unless the context holds
    exactly this prompt already); its state as wire bytes."""
    n = len(tokens)
    if llm.n_tokens != n or llm.input_ids[:n].tolist() != tokens:
        llm.reset()
        llm._ctx.kv_cache_clear()
        llm.eval(tokens)
    ctx = llm._ctx.ctx
    size = _llama().llama_state_seq_get_size(ctx, SEQ)
    buf = (ctypes.c_uint8 * size)()
    got = _llama().llama_state_seq_get_data(ctx, buf, size, SEQ)
    if got == 0 or got > size:
        raise RuntimeError(f"llama.cpp exported {got} of {size} state bytes")
    return Exported(n, pack(tokens, bytes(memoryview(buf)[:got])))


def load(llm: Llama, blob: bytes | bytearray | mmap.mmap) -> list[int]:
    """Put a wire blob's state in the context (replacing what was there); the
    prompt's token ids. BadState when llama.cpp refuses it (another model, a
    different context layout, corrupt bytes)."""
    tokens, state = unpack(blob, llm.n_ctx())
    buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
    llm.reset()
    llm._ctx.kv_cache_clear()
    if _llama().llama_state_seq_set_data(llm._ctx.ctx, buf, len(state), SEQ) == 0:
        llm._ctx.kv_cache_clear()
        raise BadState("KV state: llama.cpp refused it (another model or corrupt bytes)")
    llm.input_ids[: len(tokens)] = tokens
    llm.n_tokens = len(tokens)
    return tokens


def _llama():  # type: ignore[no-untyped-def]
    import llama_cpp

    return llama_cpp
