"""The simulated controller removes the control instance the controller's
core picks (``scaling.scale_in_victim``), not one of its own choosing."""

from controlplane.controller.registry import State
from controlplane.controller.scaling import scale_in_victim
from simulator import workload as wl
from simulator.galaxy.model import GalaxyModel
from simulator.system import Env, SimConfig


def test_the_simulator_removes_the_instance_the_core_picks(cal):
    w = wl.poisson(10.0, 1.0, n_functions=2, mean_duration_s=0.5, seed=1)
    model = GalaxyModel(Env(SimConfig(nodes=4), cal, w, 1), instances=3)
    cp = model.control
    # The newest Schedule instance is draining: the core skips it.
    newest = max(cp.insts["schedule"], key=lambda i: int(i.rsplit("-", 1)[1]))
    sched_kind = next(m.info.kind for m in cp.registry.members() if m.info.id == newest)
    cp.registry.set_state(sched_kind, newest, State.DRAINING)
    before = set(cp.insts["schedule"])
    cp.remove("schedule")
    gone = before - set(cp.insts["schedule"])
    ready = [m.info.id for m in cp.registry.members(sched_kind, State.READY)] + list(gone)
    order = sorted(before, key=lambda i: int(i.rsplit("-", 1)[1]), reverse=True)
    assert gone == {scale_in_victim(ready, order)}
    assert newest not in gone
