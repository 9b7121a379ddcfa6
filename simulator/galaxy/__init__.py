"""The Galaxy model: Dispatch, Schedule and ClusterMgr instances driven by
the production policy objects (see ``model``)."""

from simulator.galaxy.model import VARIANTS, GalaxyConfig, GalaxyModel

__all__ = ["VARIANTS", "GalaxyConfig", "GalaxyModel"]
