"""Code, docs and test names speak of the product, not of how it was made.

A figure or a change is dated by its date, its commit and the command that
reproduces it; a numbered work period (the word "session" and a number) or
a relative one ("this session", "last session") means nothing to a reader.
This test scans every tracked text file for such phrases and names each hit
as file:line.

The word "session" alone stays allowed: HTTP and TLS sessions,
``aiohttp.ClientSession``, pytest's session-scoped fixtures and
``start_new_session`` are technical terms. Only a session with a number or
with a word that places it in a sequence of work periods is caught.
"""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: The word with a number after a blank (a line break too) or a hyphen,
#: singular or plural.
NUMBERED = r"\bsessions?(?:\s+|-)\d+"
#: "this session", "last session's", "an earlier session", "the same session".
RELATIVE = r"\b(?:this|last|previous|prior|next|earlier|later|same|current)\s+sessions?\b"
HISTORY = re.compile(f"{NUMBERED}|{RELATIVE}", re.IGNORECASE)


def history_words(text: str) -> list[tuple[int, str]]:
    """(line number, line) where each phrase in ``text`` that dates by a work
    period starts; the whole text is searched, so a phrase broken over two
    lines is found too."""
    lines = text.splitlines()
    hits = []
    for m in HISTORY.finditer(text):
        n = text.count("\n", 0, m.start()) + 1
        hits.append((n, lines[n - 1] if n <= len(lines) else ""))
    return hits


def tracked_text_files() -> list[Path]:
    """Every file git tracks in this checkout, except this test itself."""
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    ).stdout
    me = Path(__file__).resolve()
    paths = (REPO / p for p in out.split("\0") if p)
    return [p for p in paths if p.is_file() and p.resolve() != me]


def test_the_pattern_catches_work_periods_and_spares_technical_sessions():
    # Spelt in two parts, so that this file is no hit for a plain
    # `git grep` of the phrase either.
    s, cap = "session", "Session"
    caught = [
        f"measured in {s} 23",
        f"(docs/benchmarks.md, {cap} 20)",
        f"{s}s 22-23",
        f"after the {s}-21 calibration",
        f"## {cap} 24: batches",
        "Earlier in this session, on a less loaded machine",
        "the last session's table",
        "an earlier session",
        "a figure of the previous session",
        f"the p99 (1.49 in {s}\n  21; not a model effect)",
        "as measured in an earlier\nsession",
    ]
    spared = [
        "async with aiohttp.ClientSession() as s:",
        '@pytest.fixture(scope="session")',
        "One etcd server shared by the whole session.",
        "start_new_session=True,  # own process group",
        "TLS session resumption",
        "Close the HTTP session.",
        "one session per instance, 20 connections",
    ]
    assert [c for c in caught if not history_words(c)] == []
    assert [c for c in spared if history_words(c)] == []


def test_no_work_history_words_in_tracked_files():
    hits = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # images and other binary files
        rel = path.relative_to(REPO)
        hits += [f"{rel}:{n}: {line.strip()[:120]}" for n, line in history_words(text)]
    assert hits == [], "date by date, commit and command instead:\n" + "\n".join(hits)
