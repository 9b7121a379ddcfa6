"""Which KV transfers the node's KV relay carries, and where (pure: no I/O;
the clock is passed in). The relay itself is ``kvrelay``.

An instance in a bubblewrap sandbox cannot reach another instance: the
prefill instance of a disaggregated request hands its cache (a memfd) to the
node agent instead, with a header naming the target and the decode
instance's lease token. ``KvRoutes.admit`` decides:

- **Who may send**: only an instance of this node that joined the relay
  (its socket is its own: the agent knows who is on the other end).
- **To whom**: same node (``shm:@galaxy-kvfd-<id>``), only an instance of
  this node whose function names the sender's function as its prefill pool
  (``pd.prefill``) in the same namespace, so one tenant's instance never
  reaches another's; another node (``http://HOST:PORT``), only a port in the
  range instances' entries are drawn from, never this node's own entries
  (those go the same-node way, where the function is checked), and the
  remote entry admits the bytes only with a lease for its instance.
- **With what**: a lease token Dispatch signed for the decode instance
  (checked here for both ways; the remote entry checks it again).
- **How much**: at most ``max_transfers`` at once and ``max_bytes`` of
  caches in flight on the node; each transfer's deadline is the sender's,
  at most ``max_timeout_s``.

A refusal is an HTTP-like status and a message naming the field.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.runtime import kvaddr
from controlplane.runtime.leasetoken import LeaseKey, Verdict
from controlplane.runtime.netaddr import split_host_port


@dataclass(frozen=True)
class Member:
    """An instance of this node that may use the relay, as its spec says."""

    instance_id: str
    namespace: str
    #: its function's name (without a revision)
    function: str
    #: the prefill function its function names (``pd.prefill``; "" if none)
    prefill: str
    #: where its entry listens (host:port): the same node's HTTP way in
    address: str


@dataclass(frozen=True)
class Transfer:
    """One admitted transfer: to ``local`` (same node) or ``url`` (another
    node's entry), within ``timeout_s``."""

    kv_id: str
    tokens: int
    size: int
    timeout_s: float
    lease: str
    local: Member | None = None
    url: str = ""

    def header(self) -> dict[str, object]:
        """The header the receiver's own socket reads (``kvshm``)."""
        return {"kv_id": self.kv_id, "tokens": self.tokens, "size": self.size}


class Refused(Exception):
    """A transfer the relay does not carry: status and a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _int(head: dict[str, object], name: str) -> int:
    v = head.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise Refused(400, f"KV relay: {name} must be an integer of at least 1")
    return v


def _str(head: dict[str, object], name: str, most: int = 1024) -> str:
    v = head.get(name, "")
    if not isinstance(v, str) or len(v) > most:
        raise Refused(400, f"KV relay: {name} must be a string of at most {most} characters")
    return v


@dataclass
class KvRoutes:
    """The relay's decisions for one node (see the module docstring).

    key: the cluster's lease key (None: leases are not checked, as the
    node's entry checks none then). ports: the range (low, high) remote
    entries listen in. clock_ms: wall clock, milliseconds.
    """

    key: LeaseKey | None
    ports: tuple[int, int]
    clock_ms: Callable[[], int]
    max_transfers: int = 8
    max_bytes: int = 1 << 30
    max_timeout_s: float = 120.0
    members: dict[str, Member] = field(default_factory=dict)
    in_flight: int = 0
    held: int = 0

    def join(self, member: Member) -> None:
        """member may send and receive through the relay."""
        self.members[member.instance_id] = member

    def leave(self, instance_id: str) -> None:
        """The instance is gone."""
        self.members.pop(instance_id, None)

    def admit(self, sender: str, header: bytes) -> Transfer:
        """The transfer a member's header asks for, counted in flight until
        ``done``; Refused with the reason."""
        src = self.members.get(sender)
        if src is None:
            raise Refused(403, "KV relay: the sender is not an instance of this node")
        try:
            head = json.loads(header)
        except (ValueError, RecursionError):
            head = None
        if not isinstance(head, dict):
            raise Refused(400, "KV relay: the header is a JSON object")
        kv_id = _str(head, "kv_id", kvaddr.MAX_ID)
        if not kvaddr.valid_id(kv_id):
            raise Refused(400, "kv_id: 1-64 of A-Z, a-z, 0-9, '-', '_'")
        tokens, size = _int(head, "tokens"), _int(head, "size")
        target, lease = _str(head, "target"), _str(head, "lease")
        timeout = head.get("timeout_s", self.max_timeout_s)
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
            raise Refused(400, "KV relay: timeout_s must be a positive number of seconds")
        timeout_s = min(float(timeout), self.max_timeout_s)
        prefix = f"shm:@{kvaddr.SHM_PREFIX}"
        if target.startswith(prefix):
            dst = self.members.get(target[len(prefix) :])
            if dst is None:
                raise Refused(404, "target: no such instance on this node")
            if dst.namespace != src.namespace or dst.prefill != src.function:
                raise Refused(403, "target: its function does not take caches from yours")
            self._check_lease(lease, dst.instance_id)
            t = Transfer(kv_id, tokens, size, timeout_s, lease, local=dst)
        elif target.startswith("http://"):
            instance = _str(head, "instance", kvaddr.MAX_ID)
            if not kvaddr.valid_id(instance):
                raise Refused(400, "instance: the decode instance's id (the lease names it)")
            self._check_remote(target[len("http://") :].rstrip("/"))
            self._check_lease(lease, instance)
            url = f"{target.rstrip('/')}/v1/kv/{kv_id}"
            t = Transfer(kv_id, tokens, size, timeout_s, lease, url=url)
        else:
            raise Refused(400, "target: shm:@galaxy-kvfd-<instance> or http://HOST:PORT")
        if self.in_flight >= self.max_transfers or size > self.max_bytes - self.held:
            raise Refused(
                429,
                f"KV relay busy: {self.in_flight} transfers, {self.held} of {self.max_bytes} "
                f"bytes in flight",
            )
        self.in_flight += 1
        self.held += size
        return t

    def done(self, t: Transfer) -> None:
        """An admitted transfer has ended (whatever its outcome)."""
        self.in_flight -= 1
        self.held -= t.size

    def _check_lease(self, lease: str, instance_id: str) -> None:
        if self.key is None:
            return
        verdict = self.key.verify(lease, instance_id, self.clock_ms())
        if verdict is not Verdict.OK:
            raise Refused(verdict.status, f"lease: {verdict.value}")

    def _check_remote(self, hostport: str) -> None:
        try:
            host, port = split_host_port(hostport)
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise Refused(400, "target: http://ADDRESS:PORT (an address, not a name)") from None
        if ip.is_unspecified or ip.is_multicast:
            raise Refused(403, "target: not an address of a node")
        if any(m.address == hostport for m in self.members.values()):
            raise Refused(403, "target: an instance of this node (shm:@galaxy-kvfd-<instance>)")
        lo, hi = self.ports
        if not lo <= int(port) < hi:
            raise Refused(403, f"target: not an instance's entry (ports {lo}-{hi - 1})")
