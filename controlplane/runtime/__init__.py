"""The runtime library every Galaxy process shares: RPC helpers and the
server host, the injectable clock, errors, metrics, membership and
rendezvous hashing, resources, function specs and load reports.

It imports nothing else of ours (only the generated ``galaxy.v1`` code), so
any service, tool or the simulator can depend on it (docs/architecture.md).
"""
