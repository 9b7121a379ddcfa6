"""Inference graphs in the gateway: where a graph is found (``source``: the
controller, then ``--graphs-dir``), the pure planner (``planner``) and the
gateway running them (``runner``). Specs: ``controlplane.runtime.graphspec``
(the controller checks them too)."""
