"""Which control instance a scale-in removes is decided once, in the
controller's pure core (``scaling.scale_in_victim``): the reconcile loop
asks it with the actuator's order (the simulator: tests/simulator/test_scale_in.py)."""

from controlplane.controller.scaling import scale_in_victim


def test_the_actuators_first_ready_instance_goes():
    assert scale_in_victim(["a", "b", "c"], ["c", "b", "a"]) == "c"
    # A draining (not READY) instance is never picked, even if preferred.
    assert scale_in_victim(["a", "b"], ["c", "b", "a"]) == "b"
    assert scale_in_victim(["a"], ["z"]) is None
    assert scale_in_victim([], []) is None
