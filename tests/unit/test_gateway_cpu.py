"""The gateway bench's CPU accounting (controlplane/bench/gateway.py): per
thread where every thread lives through the round, and never below what a
process's own ticks say when a thread ended in it (that once reported a
negative CPU per request)."""

from __future__ import annotations

import os
import threading
import time

from controlplane.bench.gateway import _Cpu


def test_threads_alive_throughout_are_counted_exactly() -> None:
    before = _Cpu({(1, 1): 1_000, (1, 2): 5_000}, {1: 0})
    after = _Cpu({(1, 1): 4_000, (1, 2): 6_000, (1, 3): 500}, {1: 0})
    assert after.since(before) == 3_000 + 1_000 + 500  # a new thread: all of its time


def test_a_thread_that_ended_falls_back_to_the_process_ticks() -> None:
    # Thread 2 ran 50 ms before the first reading and ended: by threads the
    # process lost time; its ticks say it used 20 ms.
    before = _Cpu({(1, 1): 1_000_000, (1, 2): 50_000_000}, {1: 100_000_000})
    after = _Cpu({(1, 1): 3_000_000}, {1: 120_000_000})
    assert after.since(before) == 20_000_000
    # Two processes: each is judged on its own threads.
    before2 = _Cpu({**before.threads, (2, 7): 0}, {**before.processes, 2: 0})
    after2 = _Cpu({**after.threads, (2, 7): 9_000}, {**after.processes, 2: 0})
    assert after2.since(before2) == 20_000_000 + 9_000


def test_a_real_thread_that_ends_between_readings_does_not_make_the_figure_negative() -> None:
    pid = os.getpid()
    worked, read = threading.Event(), threading.Event()

    tid: list[int] = []

    def work() -> None:
        tid.append(threading.get_native_id())
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        worked.set()  # it has used 50 ms of CPU...
        read.wait(10)  # ...and lives until the first reading is taken

    t = threading.Thread(target=work)
    t.start()
    assert worked.wait(10)
    before = _Cpu.now([pid])
    read.set()
    t.join()
    # join() returns before the kernel's task has gone, and nothing can be
    # awaited for that (Python's threads are detached): look until it has.
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/self/task/{tid[0]}") and time.monotonic() < deadline:
        time.sleep(0.001)
    after = _Cpu.now([pid])
    assert (pid, tid[0]) in before.threads and (pid, tid[0]) not in after.threads
    # The sum over the threads alive goes down by the ended thread's time:
    by_threads = sum(v - before.threads.get(k, 0) for k, v in after.threads.items())
    by_threads -= sum(v for k, v in before.threads.items() if k not in after.threads)
    assert by_threads < 0
    assert after.since(before) >= 0


def test_a_process_that_ends_between_readings_keeps_its_time_below_its_root() -> None:
    import subprocess
    import sys

    from controlplane.bench.gateway import _descendants_cpu_ns

    me = os.getpid()
    burn = "import time\nend = time.process_time() + 0.05\nwhile time.process_time() < end: pass\n"
    child = subprocess.Popen([sys.executable, "-c", burn + "input()"], stdin=subprocess.PIPE)
    # Until it has burnt its 50 ms (a tick-counted figure) it is still running.
    deadline = time.monotonic() + 10
    while _descendants_cpu_ns([me]) < 40_000_000 and time.monotonic() < deadline:
        time.sleep(0.01)  # its CPU time has no event to await
    before = _descendants_cpu_ns([me])
    assert before >= 40_000_000
    child.communicate(b"\n")  # it ends, and is reaped by this process
    assert _descendants_cpu_ns([me]) >= before
