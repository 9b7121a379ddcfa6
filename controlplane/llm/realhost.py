"""One real model in one process: llama.cpp's weights, its context, and the
three things the real-model server asks of them (complete a prompt, prefill
one and export its state, continue from an imported state), plus sleep.

Sleeping releases the llama.cpp *context* (the KV cache and the compute
buffers, which scale with ``n_ctx``) and keeps the *model*: its weights stay
mapped (``use_mmap``: the file's pages stay in the page cache and in this
process's address space), so waking is building a new context, not loading
a model. Why this and not ``SIGSTOP`` of the whole process: a stopped
process keeps every byte it holds (KV included) and the runtime cannot
answer while stopped, so the node agent would have to sit in front of it to
wake it; releasing the context returns the memory that grows with ``n_ctx``
and the process wakes itself on its next request (figures: docs/llm.md,
"Real KV transfer and sleeping instances").

Waking in huge pages: most of a wake is the kernel faulting in the new KV
cache page by page (llama.cpp clears the whole buffer it allocates: 36 MiB
at ``n_ctx`` 2,048). With transparent huge pages in ``madvise`` mode (the
default of most distributions) and glibc's malloc asked to advise them
(``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, which ``realmain`` sets), the KV
cache is faulted in 2 MiB pages: the CPU a wake adds to a first token is
2.2x lower at 2,048, 2.8x at 8,192 (docs/llm.md, "Sleeping instances"; not
inside the default bubblewrap sandbox, which hides the kernel's setting
from glibc). Huge pages are allowed only while a context is built
(``prctl(PR_SET_THP_DISABLE)`` around it): the compute buffers, touched
sparsely by each request, stay in small pages, so an awake instance holds
no more memory than without them.

Not thread-safe (llama.cpp's context is not): the server runs every call
through one worker thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controlplane.llm import realkv

if TYPE_CHECKING:
    from llama_cpp import Llama


@dataclass(frozen=True)
class Output:
    """A completion's text and what it cost."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    #: tokens this instance ran through the model for the prompt (1 when
    #: the prompt's state was imported: only its last token is re-evaluated)
    evaluated_prompt_tokens: int
    #: seconds spent waking first (0 when awake)
    woke_s: float


class ModelHost:
    """The model and its (releasable) context."""

    def __init__(self, model_path: str, *, n_ctx: int, n_threads: int, seed: int = 0) -> None:
        from llama_cpp import Llama

        _mapped_buffers()
        no_huge_pages()  # (but while a context is built: ``wake``)
        self.llm: Llama = Llama(
            model_path, n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
            seed=seed, use_mmap=True, verbose=False,
        )  # fmt: skip
        self.asleep = False
        self.sleeps = 0
        #: time.monotonic() when it fell asleep (while asleep)
        self.asleep_since = 0.0
        #: token counts of each eval call since the last completion began
        self._evals: list[int] = []
        plain_eval = self.llm.eval

        def counting_eval(tokens: Any) -> None:
            # Recorded so a reply can say how much of the prompt ran here.
            self._evals.append(len(tokens))
            plain_eval(tokens)

        self.llm.eval = counting_eval  # type: ignore[method-assign]

    @property
    def asleep_s(self) -> float:
        """Seconds asleep so far (0 when awake)."""
        return time.monotonic() - self.asleep_since if self.asleep else 0.0

    @property
    def n_ctx(self) -> int:
        """Context tokens (prompt + completion)."""
        return int(self.llm.context_params.n_ctx)

    def tokenize(self, text: str) -> list[int]:
        """The prompt's token ids (with the model's BOS)."""
        return list(self.llm.tokenize(text.encode()))

    def sleep(self) -> bool:
        """Release the context (KV cache, compute buffers); keep the weights.
        False when already asleep."""
        if self.asleep:
            return False
        self.llm._ctx.close()
        _give_back_freed_memory()
        self.asleep = True
        self.asleep_since = time.monotonic()
        self.sleeps += 1
        return True

    def wake(self) -> float:
        """A new, empty context if asleep; the seconds it took (0 if awake)."""
        if not self.asleep:
            return 0.0
        from llama_cpp import _internals

        t0 = time.perf_counter()
        with huge_pages():
            self.llm._ctx = _internals.LlamaContext(
                model=self.llm._model, params=self.llm.context_params, verbose=False
            )
        self.llm.reset()
        self.asleep = False
        return time.perf_counter() - t0

    def complete(
        self, tokens: list[int], max_tokens: int, temperature: float, seed: int,
        state: bytes | bytearray | mmap.mmap | None = None,
    ) -> Output:  # fmt: skip
        """Generate after the prompt; from an imported state when given
        (BadState when it does not fit, or names other tokens than the prompt)."""
        woke = self.wake()
        if state is not None:
            imported = realkv.load(self.llm, state)
            if imported != tokens:
                self.llm.reset()
                raise realkv.BadState(
                    "galaxy_kv_id: the state covers other tokens than this request's prompt"
                )
        self._evals.clear()
        r = self.llm.create_completion(
            tokens, max_tokens=max_tokens, temperature=temperature, seed=seed
        )
        # not streamed: create_completion returns one dict, not an iterator
        assert isinstance(r, dict)
        choice, generated = r["choices"][0], r["usage"]["completion_tokens"]
        # generate's first eval is the part of the prompt not already cached
        return Output(
            choice["text"], len(tokens), generated, choice["finish_reason"] or "length",
            self._evals[0] if self._evals else 0, woke,
        )  # fmt: skip

    def prefill(self, tokens: list[int]) -> tuple[realkv.Exported, float]:
        """Evaluate the prompt and export its state; and the seconds it took
        to wake first."""
        woke = self.wake()
        return realkv.export(self.llm, tokens), woke


#: prctl's option that turns transparent huge pages off for the process
PR_SET_THP_DISABLE = 41


#: mallopt's parameter: blocks this large or larger get a mapping of their own
M_MMAP_THRESHOLD = -3
MAPPED_FROM = 4 << 20


def _mapped_buffers() -> None:
    """Give every block of MAPPED_FROM bytes or more (the KV cache and the
    compute buffers of a context) a mapping of its own, for good: glibc
    otherwise raises its threshold to a freed block's size, so a context
    rebuilt after a sleep would live on a heap (whose freed pages stay until
    trimmed, and which malloc does not advise huge pages for)."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, MAPPED_FROM)


def no_huge_pages() -> None:
    """No transparent huge pages for this process from now on (but within
    ``huge_pages``): small pages for what is touched sparsely."""
    libc = _libc()
    if libc is not None:
        libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)


@contextlib.contextmanager
def huge_pages() -> Iterator[None]:
    """Memory faulted in within the block may come in transparent huge pages
    (where malloc advised them); outside it, none does. Without prctl (not
    Linux, or a sandbox that refuses it) the kernel's defaults apply."""
    libc = _libc()
    if libc is None or libc.prctl(PR_SET_THP_DISABLE, 0, 0, 0, 0) != 0:
        yield
        return
    try:
        yield
    finally:
        libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return None


def _give_back_freed_memory() -> None:
    """Return the context's freed pages to the system. glibc raises its mmap
    threshold to the size of a freed mapped block, so a context built after
    a sleep lives on the heap, whose freed pages stay resident until trimmed."""
    libc = _libc()
    if libc is not None:  # (else not glibc: its allocator returns memory its own way)
        libc.malloc_trim(0)
