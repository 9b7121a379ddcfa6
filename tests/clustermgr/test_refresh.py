"""ClusterMgr forwards unchanged heartbeats to Schedule only now and then, so
a Schedule instance that comes back at a new address (crashed, restarted
without deregistering) must get its partition from the membership change."""

from __future__ import annotations

import pytest

from tests.cluster import InProcessCluster, eventually


@pytest.mark.slow
async def test_restarted_schedule_gets_its_nodes_from_the_membership_change():
    c = InProcessCluster()
    try:
        await c.add("controller", "controller")
        await c.add("clustermgr", "clustermgr-0", "--heartbeat-ms", "1000")
        old = await c.add("schedule", "schedule-0")
        await c.add("nodeagent", "agent-0", "--nodes", "5", "--sandbox", "emulated")
        await eventually(lambda: len(old.component.servicer.policy) == 5)
        cm = c.parts["clustermgr-0"].component.servicer
        # Counted when the reply is back, which can come after Schedule
        # applied the nodes: drained first, so the count is the first five's.
        await cm.outbox.flush()
        sent = cm.outbox.sent
        # Same id, new address, old one never deregistered: a crash + restart.
        new = await c.add("schedule", "schedule-0")
        # Well inside the 10 s refresh period of unchanged heartbeats.
        await eventually(
            lambda: len(new.component.servicer.policy) == 5,
            3.0,
            "partition re-sent to the restarted instance",
        )
        await cm.outbox.flush()
        assert cm.outbox.sent >= sent + 5
        old.stop.set()
        await old.task
    finally:
        await c.close()
