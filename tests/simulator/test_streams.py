"""What a credit start's CreateInstance costs on the simulated InstanceStream:
messages queued while a write is in flight share the next write
(production's batching), so under load a message costs less than a unary
call, and a lone message pays a write and a read as before."""

from simulator.engine import Sim, Station
from simulator.galaxy.streams import Stream

WRITE = 150e-6
SEND = 50e-6
HANDLE = 80e-6


def _stream() -> tuple[Sim, Station, Station, Stream, list[int]]:
    sim = Sim()
    sender, receiver = Station("dispatch"), Station("agent")
    s = Stream(sim, lambda: 10e-6, sender, receiver, lambda: WRITE, lambda: WRITE)
    return sim, sender, receiver, s, []


def test_a_burst_shares_writes_and_costs_less_per_message_than_one_by_one():
    """N messages sent together: fewer writes than messages, and the sender's
    CPU per message is below a lone message's (write + its own work)."""
    n = 20
    sim, sender, receiver, s, got = _stream()
    for i in range(n):
        s.send(0.0, SEND, HANDLE, got.append, i)
    sim.run(1.0)
    assert got == list(range(n))  # each handled, in order
    assert s.messages == n
    assert 1 < s.batches < n
    lone = WRITE + SEND
    assert sender.busy / n < lone
    assert receiver.busy / n < WRITE + HANDLE
    # Work is conserved: a write per batch plus each message's own work.
    assert abs(sender.busy - (s.batches * WRITE + n * SEND)) < 1e-12


def test_messages_spread_out_each_pay_a_write_and_a_read():
    """At low load every message finds no write in flight: one write each
    (the unary-like cost, no saving)."""
    n = 5
    sim, sender, receiver, s, got = _stream()
    for i in range(n):
        sim.at(i * 0.01, lambda i: s.send(sim.now, SEND, HANDLE, got.append, i), i)
    sim.run(1.0)
    assert got == list(range(n))
    assert s.batches == n
    assert abs(sender.busy - n * (WRITE + SEND)) < 1e-12
    assert abs(receiver.busy - n * (WRITE + HANDLE)) < 1e-12


def test_a_credit_start_in_a_burst_costs_dispatch_less_than_a_unary_start(cal):
    """The credit path's CreateInstance and its answer are stream messages:
    at 32 starts in flight Dispatch spends less per start than the unary
    charge the model made before (request + decision + ``dispatch.scale_up``,
    the Schedule path's client CPU measured before stream batches)."""
    from simulator import fidelity

    r = fidelity.sim_phase(cal, 210, 300, 1, concurrency=32, credits=True)
    assert r["counts"]["credit_hits"] > r["counts"]["credit_misses"]
    per_start = r["cpu_cores"]["dispatch-0"] / r["instances_per_s"]
    unary = sum(cal.mean(k) for k in ("dispatch.dispatch", "schedule.decide", "dispatch.scale_up"))
    assert per_start < 0.8 * unary


def test_the_fidelity_load_generator_shares_writes_on_its_dispatch_stream(cal):
    """32 requests in flight on one DispatchStream and starts on the
    InstanceStreams: Dispatch's CPU per start is below what the same work
    costs with a read and a write per message (each request and each
    CreateInstance alone on its stream)."""
    from simulator import fidelity

    r = fidelity.sim_phase(cal, 210, 300, 1, concurrency=32, credits=True)
    per_start = r["cpu_cores"]["dispatch-0"] / r["instances_per_s"]
    alone = (
        cal.mean("dispatch.dispatch")  # the request: its work, a read and a write
        + cal.mean("schedule.decide")
        + cal.mean("dispatch.credit_create")
        + 2 * cal.mean("dispatch.stream_write")  # CreateInstance out, its answer in
    )
    assert per_start < 0.8 * alone
