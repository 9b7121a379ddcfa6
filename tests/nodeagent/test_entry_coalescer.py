"""What the door holds of an instance's answers (entry/answers.py, pure):
bytes in, bytes to write out. Over real sockets: test_entry_answers.py."""

from __future__ import annotations

from controlplane.nodeagent.entry.answers import Coalescer

HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"


def test_a_small_answer_is_held_until_complete_then_given_whole() -> None:
    c = Coalescer()
    assert c.feed(HEAD) == b""
    assert c.feed(b"hel") == b""
    assert c.held == len(HEAD) + 3
    assert c.feed(b"lo") == HEAD + b"hello"
    assert c.held == 0


def test_a_body_longer_than_the_bound_is_not_held() -> None:
    c = Coalescer(bound=4)
    assert c.feed(HEAD) == HEAD
    assert c.feed(b"hello") == b"hello"
    assert Coalescer(bound=5).feed(HEAD) == b""


def test_a_length_beside_a_transfer_encoding_is_not_trusted() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"
    c = Coalescer()
    out = c.feed(head)
    assert out == head  # passed on (or the parser refused it and c went plain)


def test_a_chunked_answers_trailers_do_not_frame_the_next_answer() -> None:
    c = Coalescer()
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert c.feed(chunked) == chunked
    done = b"5\r\nhello\r\n0\r\nContent-Length: 3\r\n\r\n"  # a trailer named so
    assert c.feed(done) == done
    # The next answer has no length of its own: it streams.
    until_close = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
    assert c.feed(until_close) == until_close


def test_what_does_not_parse_passes_for_good() -> None:
    c = Coalescer()
    assert c.feed(b"SSH-2.0-x\r\n") == b"SSH-2.0-x\r\n"
    assert c.plain
    assert c.feed(HEAD) == HEAD


def test_stop_gives_back_what_is_held_and_passes_the_rest() -> None:
    c = Coalescer()
    assert c.feed(HEAD) == b""
    assert c.stop() == HEAD
    assert c.feed(b"hello") == b"hello"
    assert c.drain() == b""
