"""Per-function autoscaler settings are merged by one function
(``kpaconfig.function_kpa``) in Dispatch and in the simulator: with
non-default Dispatch-wide settings both build the same KPA."""

from controlplane.runtime.clock import ManualClock
from functions.dispatch.autoscale import FunctionAutoscaling
from functions.dispatch.autoscaling.settings import AutoscaleSettings
from galaxy.v1 import common_pb2
from simulator import workload as wl
from simulator.galaxy.model import GalaxyModel
from simulator.system import Env, SimConfig

#: every field away from its default
SETTINGS = AutoscaleSettings(
    tick_s=0.5,
    stable_window_s=20.0,
    scale_to_zero_grace_s=5.0,
    target_utilization=0.7,
    keepalive="fixed",
)


def test_dispatch_and_simulator_merge_the_same_kpa(cal):
    w = wl.poisson(10.0, 1.0, n_functions=3, mean_duration_s=0.5, seed=1)
    sim_cfg = SimConfig(nodes=4, keep_alive_s=7.0, autoscale=SETTINGS)
    model = GalaxyModel(Env(sim_cfg, cal, w, 1), instances=1)
    prod = FunctionAutoscaling(
        AutoscaleSettings(**{**SETTINGS.__dict__, "keepalive_s": 7.0}), ManualClock()
    )
    fs = model.scaling
    assert fs.tick_s == SETTINGS.tick_s
    for fn, f in enumerate(w.functions):
        spec = common_pb2.FunctionSpec(
            name=f.name, version=1, concurrency=f.concurrency, max_scale=f.max_scale
        )
        scaler = prod._scaler(spec)
        assert fs.make_config(fn) == scaler.config
        assert scaler.config.stable_window_s == 20.0  # the settings reached it
        assert scaler.config.target_utilization == 0.7
        # The same keep-alive policy, with the same options.
        assert fs.keepalive == "fixed" and fs.keepalive_opts == {"seconds": 7.0}
        assert type(scaler.keepalive).__name__ == "FixedKeepAlive"
        assert scaler.keepalive.keep_alive_s(0.0) == 7.0


def test_the_simulator_keep_alive_default_is_dispatch_s():
    assert SimConfig().keep_alive_s == AutoscaleSettings().keepalive_s


def test_a_valid_short_window_spec_yields_a_kpa_that_runs():
    """Validation accepts stable_window_ms 6000 (Knative's minimum); with the
    default 10% its panic window (0.6 s) is below the 2 s tick, which KpaConfig
    refuses. The merge raises it to one tick instead of failing every tick."""
    from controlplane.runtime.validation import STABLE_WINDOW_MS_MIN, check_autoscaling

    a = common_pb2.AutoscalingSpec(stable_window_ms=STABLE_WINDOW_MS_MIN)
    check_autoscaling(a)  # accepted at deploy
    spec = common_pb2.FunctionSpec(name="short", version=1, concurrency=1, autoscaling=a)
    scaler = FunctionAutoscaling(AutoscaleSettings(tick_s=2.0), ManualClock())._scaler(spec)
    assert scaler.config.stable_window_s == 6.0
    assert scaler.config.panic_window_s == 2.0  # one tick, not 0.6 s
    # A Dispatch-wide stable window shorter than a tick is raised to the tick.
    wide = FunctionAutoscaling(AutoscaleSettings(tick_s=2.0, stable_window_s=1.0), ManualClock())
    cfg = wide._scaler(common_pb2.FunctionSpec(name="w", version=1, concurrency=1)).config
    assert (cfg.stable_window_s, cfg.panic_window_s) == (2.0, 2.0)
