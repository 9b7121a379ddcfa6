"""Limits and switches are written once: the simulator's control-instance
limit and scaling knobs are the controller's, and `galaxy up`'s ablation
switches are the components' own settings."""

from controlplane.controller.config import ControllerConfig
from controlplane.controller.main import scaling_config
from controlplane.controller.scaling import DEFAULT_MAX_INSTANCES, KindLimits
from controlplane.launch.upconfig import UpConfig
from controlplane.runtime.config import RpcConfig, flag_of
from functions.schedule.config import ScheduleConfig
from simulator import workload as wl
from simulator.galaxy.model import GalaxyConfig, GalaxyModel
from simulator.system import Env, SimConfig

SWITCHES = {
    RpcConfig: ("connection_cache", "agent_streams", "stream_batches", "heartbeat_batches"),
    ScheduleConfig: ("probe_cache", "exact_partition", "credits"),
}


def test_the_simulator_scales_control_functions_within_productions_limit(cal):
    assert GalaxyConfig().max_instances == DEFAULT_MAX_INSTANCES == KindLimits(1.0).max_instances
    w = wl.poisson(10.0, 1.0, n_functions=2, mean_duration_s=0.5, seed=1)
    model = GalaxyModel(Env(SimConfig(nodes=4), cal, w, 1))
    scaler = model.control.scaler
    assert scaler is not None
    caps = {k: v.capacity for k, v in scaler.config.limits.items()}
    # The controller, given the same capacities, builds the same configuration.
    prod = scaling_config(ControllerConfig(t_df=caps["dispatch"], t_sf=caps["schedule"],
                                           t_cmf=caps["clustermgr"]))  # fmt: skip
    assert scaler.config == prod
    # An override is production's flag, and reaches the simulated limit.
    big = GalaxyModel(Env(SimConfig(nodes=4), cal, w, 1), max_instances=64).control.scaler
    assert big is not None
    assert {v.max_instances for v in big.config.limits.values()} == {64}


def test_up_takes_each_switch_from_the_component_that_reads_it():
    up = UpConfig.model_fields
    for cls, names in SWITCHES.items():
        for name in names:
            assert up[name].default == cls.model_fields[name].default, name
            assert flag_of(UpConfig, name) == flag_of(cls, name), name
