"""Inference graphs: specs (``spec``), the pure planner (``planner``) and
the gateway running them (``runner``)."""
