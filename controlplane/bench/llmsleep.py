"""Sleeping instances of the real model against the other ways back to a
first token: a cold start (from a warm page cache), waking from sleep
(realhost: the context released, the weights kept), a process resumed after
``SIGSTOP``, and an awake instance.

    python -m controlplane.bench.llmsleep --trials 5 --out results/llm-sleep.json

Each first token is a ``POST /v1/completions`` of ``max_tokens: 1`` on a
prompt the instance has not seen (so no prefix cache helps), timed from the
action that starts the way back (exec for a cold start, the request for a
sleeping instance, ``SIGCONT`` for a stopped one; and a sleeping instance
woken by ``POST /v1/galaxy/wake`` before the request, timed from the
request). Also the instance's CPU time per first token (the machine's load
scales wall times; the CPU a wake adds is the wake's own), and the resident
memory (RssAnon: the weights' mapped pages are the page cache's) awake,
asleep and stopped. The goal: a sleeping instance's first token within
0.5 s (p50).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controlplane.bench.kvtransfer import _await_http
from controlplane.bench.llmup import write_text

REPO = Path(__file__).resolve().parents[2]
#: The number leads, so no two prompts share a prefix past the BOS token.
PROMPT = "{n} things to pack for a week of hiking in the mountains, a list:"
GOAL_S = 0.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _call(url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(url, data=data, timeout=300) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


class Instance:
    """One realserver process on loopback."""

    def __init__(self, model: Path, n_ctx: int) -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = dict(os.environ, HOST="127.0.0.1", PORT=str(port))
        argv = ["-m", "controlplane.llm.realmain", "--model", str(model),
                "--n_ctx", str(n_ctx), "--n_threads", "1"]  # fmt: skip
        quiet = subprocess.DEVNULL
        self.proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env,
                                     stdout=quiet, stderr=quiet)  # fmt: skip
        self.asked = 0

    def ready(self) -> None:
        """Wait for the health route (an external process: polled)."""
        _await_http(self.url, self.proc, within_s=300)

    def first_token(self) -> dict[str, Any]:
        """One token of a prompt not asked before."""
        self.asked += 1
        body = {"prompt": PROMPT.format(n=self.asked * 7 + 3), "max_tokens": 1}
        return _call(self.url + "/v1/completions", body)

    def rss_mib(self) -> float:
        """Resident anonymous memory (RssAnon): what the process holds beyond
        the mapped weights, whose pages are the page cache's, shared."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no RssAnon")

    def cpu_s(self) -> float:
        """CPU seconds the process's threads ran so far (schedstat, in ns:
        finer than the clock ticks of /proc/PID/stat): what a first token
        costs it, whatever else the machine runs."""
        total = 0
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, IndexError, ValueError):
                continue  # (a thread that just ended)
        return total / 1e9

    def stop(self) -> None:
        """Kill the process."""
        self.proc.kill()
        self.proc.wait(timeout=30)


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def cold_starts(model: Path, n_ctx: int, trials: int) -> list[float]:
    """Exec to first token, the page cache warm (the file was read before)."""
    times = []
    for _ in range(trials):
        t0 = time.perf_counter()
        inst = Instance(model, n_ctx)
        try:
            inst.ready()
            inst.first_token()
            times.append(time.perf_counter() - t0)
        finally:
            inst.stop()
    return times


def one_instance(model: Path, n_ctx: int, trials: int) -> dict[str, Any]:
    """Awake, sleeping and stopped first tokens and memory of one instance."""
    inst = Instance(model, n_ctx)
    try:
        inst.ready()
        inst.first_token()  # the first request pays one-off allocations
        awake, awake_cpu = [], []
        for _ in range(trials):
            c0 = inst.cpu_s()
            awake.append(_timed(inst.first_token))
            awake_cpu.append(inst.cpu_s() - c0)
        rss_awake = inst.rss_mib()
        wakes, woke_s, rss_asleep, asleep_cpu = [], [], [], []
        for _ in range(trials):
            _call(inst.url + "/v1/galaxy/sleep", {})
            rss_asleep.append(inst.rss_mib())
            c0 = inst.cpu_s()
            t0 = time.perf_counter()
            out = inst.first_token()
            wakes.append(time.perf_counter() - t0)
            asleep_cpu.append(inst.cpu_s() - c0)
            woke_s.append(out["usage"]["galaxy_woke_s"])
        ahead = []  # woken by POST /v1/galaxy/wake before the request
        for _ in range(trials):
            _call(inst.url + "/v1/galaxy/sleep", {})
            _call(inst.url + "/v1/galaxy/wake", {})
            ahead.append(_timed(inst.first_token))
        stopped, rss_stopped = [], []
        for _ in range(trials):
            inst.proc.send_signal(signal.SIGSTOP)
            rss_stopped.append(inst.rss_mib())
            t0 = time.perf_counter()
            inst.proc.send_signal(signal.SIGCONT)
            inst.first_token()
            stopped.append(time.perf_counter() - t0)
        return {
            "awake_s": awake, "asleep_s": wakes, "context_rebuild_s": woke_s,
            "awake_cpu_s": awake_cpu, "asleep_cpu_s": asleep_cpu,
            "woken_ahead_s": ahead,
            "stopped_s": stopped, "rss_mib": {"awake": rss_awake,
            "asleep": statistics.median(rss_asleep), "stopped": statistics.median(rss_stopped)},
        }  # fmt: skip
    finally:
        inst.stop()


def run(model: Path, n_ctx: int, trials: int) -> dict[str, Any]:
    """Both measurements, with p50s."""
    model.read_bytes()  # the page cache warm, as on a node that ran it before
    r = one_instance(model, n_ctx, trials)
    r["cold_s"] = cold_starts(model, n_ctx, trials)
    kinds = ("awake_s", "asleep_s", "woken_ahead_s", "stopped_s", "cold_s", "context_rebuild_s",
             "awake_cpu_s", "asleep_cpu_s")  # fmt: skip
    r["p50_s"] = {k[:-2]: statistics.median(r[k]) for k in kinds}
    r.update(n_ctx=n_ctx, trials=trials, goal_s=GOAL_S, model=model.name)
    r["goal_met"] = r["p50_s"]["asleep"] <= GOAL_S
    return r


def render(r: dict[str, Any]) -> str:
    """The report as a table."""
    p, m = r["p50_s"], r["rss_mib"]
    return "\n".join([
        f"first token p50 over {r['trials']} (n_ctx {r['n_ctx']}):",
        f"  awake            {p['awake']:.3f} s   anon RSS {m['awake']:.0f} MiB"
        f"   (instance CPU {p['awake_cpu'] * 1000:.0f} ms)",
        f"  asleep (wake)    {p['asleep']:.3f} s   anon RSS {m['asleep']:.0f} MiB"
        f"   (instance CPU {p['asleep_cpu'] * 1000:.0f} ms;"
        f" context rebuilt in {p['context_rebuild']:.3f} s)",
        f"  woken ahead      {p['woken_ahead']:.3f} s",
        f"  SIGSTOP/SIGCONT  {p['stopped']:.3f} s   anon RSS {m['stopped']:.0f} MiB",
        f"  cold (warm page cache) {p['cold']:.3f} s",
        f"goal: asleep p50 <= {r['goal_s']} s: {'met' if r['goal_met'] else 'NOT met'}",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Command line of ``python -m controlplane.bench.llmsleep``."""
    from controlplane.llm import realmodel

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=realmodel.existing, default=str(realmodel.DEFAULT_DEST),
                   help="the GGUF file")  # fmt: skip
    p.add_argument("--n-ctx", type=int, default=2048)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--out", default=None, help="write the report as JSON here")
    a = p.parse_args(argv)
    if not 1 <= a.trials <= 50 or not 64 <= a.n_ctx <= 32768:
        p.error("--trials 1..50, --n-ctx 64..32768")
    r = run(a.model, a.n_ctx, a.trials)
    print(render(r))
    if a.out:
        write_text(Path(a.out), json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
