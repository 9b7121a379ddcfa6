"""An instance's answers as the door relays them: a small answer leaves in
one write (pure: bytes in, bytes to write out; no I/O).

An instance's HTTP server may write an answer's head and its body apart
(the standard library's ``http.server`` does: the head on ``end_headers``,
the body after). Relayed as they come, that is two writes from the door and
two wake-ups of the caller (the gateway) per request, on a hop whose cost is
its syscalls and wake-ups (docs/security.md, "The node's entry"). So the
door parses the answers' framing (httptools, llhttp) and holds an answer
that declares a ``Content-Length`` of at most ``bound`` bytes until it is
complete, then hands it on in one write. Everything else goes out the moment
it arrives:

- an answer without a length (chunked, or until the connection closes), a
  longer one, and an interim (1xx) one: streamed answers (server-sent
  events, an LLM's tokens) are never delayed;
- answers that end in the bytes just read: several pipelined answers that
  arrive together leave together, and an answer is never held behind the
  next one's head (bytes that complete an answer release everything held);
- every byte, for good, once the framing cannot be followed: an answer that
  does not parse, an upgrade (101, WebSocket), or a request the response
  framing cannot tell apart (``HEAD``: its answer declares a length but has
  no body; ``CONNECT``), which the door reports with ``stop``.

What a held head waits for is its own body only, which the instance is
sending; bounded in bytes by ``bound`` plus the head and the read it came
in. If the instance closes before the body is complete, ``drain`` gives
back what is held so that the caller gets it before the close.
"""

from __future__ import annotations

import httptools  # type: ignore[import-not-found,unused-ignore]

#: The longest body (bytes, by its Content-Length) an answer may declare to
#: be held until complete: one write of the loop's transports.
BOUND = 64 * 1024

_LENGTH = b"content-length"
_ENCODING = b"transfer-encoding"


class Coalescer:
    """The answers of one connection into an instance, in the order the
    instance sends them."""

    def __init__(self, bound: int = BOUND) -> None:
        self.bound = bound
        self.plain = False  # for good: every byte goes out as it comes
        self._parser = httptools.HttpResponseParser(self)
        self._held: list[bytes] = []
        self._length = -1  # the current answer's Content-Length (-1: none)
        self._encoded = False  # ... or it has a Transfer-Encoding
        self._holding = False  # in a held answer's body
        self._ended = False  # an answer ended in the bytes being parsed

    @property
    def held(self) -> int:
        """Bytes held back, waiting for the rest of their answer."""
        return sum(map(len, self._held))

    # httptools callbacks, called during feed_data.
    def on_header(self, name: bytes, value: bytes) -> None:
        # Called for every header: the length tests spare a lower-cased copy
        # of each name that cannot be either.
        n = len(name)
        if n == 14 and name.lower() == _LENGTH:
            self._length = int(value) if value.isdigit() else -1
        elif n == 17 and name.lower() == _ENCODING:
            self._encoded = True

    def on_headers_complete(self) -> None:
        self._holding = not self._encoded and 0 <= self._length <= self.bound

    def on_chunk_header(self) -> None:
        self._holding = False  # a chunked body streams (never held)

    def on_message_complete(self) -> None:
        self._holding = False
        self._ended = True
        # Trailers' headers come after the head: the next answer starts
        # clean.
        self._length = -1
        self._encoded = False

    def feed(self, data: bytes) -> bytes:
        """What to write to the caller now that data came from the instance
        (empty: it is held until its answer is complete)."""
        if self.plain:
            return self._release(data)
        self._ended = False
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self.plain = True
            return self._release(data)
        if self._holding and not self._ended:
            self._held.append(data)
            return b""
        return self._release(data)

    def stop(self) -> bytes:
        """Stop parsing for good (what the door does after a request whose
        answer the framing cannot follow); gives back what was held."""
        self.plain = True
        return self._release(b"")

    def drain(self) -> bytes:
        """What is held, given back (the instance closed or the door is
        closing)."""
        return self._release(b"")

    def _release(self, data: bytes) -> bytes:
        if not self._held:
            return data
        self._held.append(data)
        out = b"".join(self._held)
        self._held.clear()
        return out
