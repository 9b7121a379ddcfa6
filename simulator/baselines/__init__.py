"""Baseline control planes (not production code; their decision logic lives
here): Knative-like centralized, Sparrow-like fully distributed, Ray-like
bottom-up and Atoll-like two-level. Every baseline shares the request data
path (``simulator.frontend``), the nodes (``simulator.cluster``), the network
and the calibration with the Galaxy model; docs/simulator.md gives each
model and the source of every parameter."""
