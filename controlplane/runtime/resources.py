"""Resource amounts: ``Res``, the resource vector used across the control
plane (Schedule's probe cache, node agents, the simulator), and ``interned``.

Pure values: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from galaxy.v1 import common_pb2

_UINT32_MAX = 2**32 - 1


@dataclass(frozen=True, slots=True)
class Res:
    """An immutable resource vector: CPU millicores, memory MiB, whole GPUs.

    Supports ``+`` and ``-`` (component-wise; ``-`` may go negative so a
    deficit stays visible) and ``fits_in``. Convert with ``from_proto`` /
    ``to_proto`` (``common_pb2.Resources``).
    """

    cpu_millis: int = 0
    memory_mib: int = 0
    gpus: int = 0

    def __init__(self, cpu_millis: int = 0, memory_mib: int = 0, gpus: int = 0) -> None:
        # What the generated frozen __init__ does (object.__setattr__ per
        # field), through the slot descriptors directly: about a third
        # cheaper, and the simulator makes millions of these.
        _set_cpu(self, cpu_millis)
        _set_mem(self, memory_mib)
        _set_gpus(self, gpus)

    def __add__(self, other: Res) -> Res:
        return interned(
            self.cpu_millis + other.cpu_millis,
            self.memory_mib + other.memory_mib,
            self.gpus + other.gpus,
        )

    def __sub__(self, other: Res) -> Res:
        return interned(
            self.cpu_millis - other.cpu_millis,
            self.memory_mib - other.memory_mib,
            self.gpus - other.gpus,
        )

    def fits_in(self, other: Res) -> bool:
        """True when every component of self is <= the same one of other."""
        return (
            self.cpu_millis <= other.cpu_millis
            and self.memory_mib <= other.memory_mib
            and self.gpus <= other.gpus
        )

    def is_zero(self) -> bool:
        """True when every component is 0."""
        return self.cpu_millis == 0 and self.memory_mib == 0 and self.gpus == 0

    def clamped(self) -> Res:
        """Components below 0 raised to 0 (self when none is: it is immutable)."""
        c, m, g = self.cpu_millis, self.memory_mib, self.gpus
        if c >= 0 and m >= 0 and g >= 0:
            return self
        return interned(max(c, 0), max(m, 0), max(g, 0))

    @classmethod
    def from_proto(cls, r: common_pb2.Resources | None) -> Res:
        """From a ``common_pb2.Resources`` (None or unset = zero)."""
        if r is None:
            return cls()
        return cls(r.cpu_millis, r.memory_mib, r.gpus)

    def to_proto(self) -> common_pb2.Resources:
        """As ``common_pb2.Resources``; components are clamped to uint32
        because the wire type cannot carry a negative deficit."""

        c, m, g = self.cpu_millis, self.memory_mib, self.gpus
        if not (0 <= c <= _UINT32_MAX and 0 <= m <= _UINT32_MAX and 0 <= g <= _UINT32_MAX):
            c, m, g = _u32(c), _u32(m), _u32(g)
        return common_pb2.Resources(cpu_millis=c, memory_mib=m, gpus=g)

    def shortfall(self, need: Res) -> list[str]:
        """Human-readable list of the components where self (free) < need."""
        out = []
        if need.cpu_millis > self.cpu_millis:
            out.append(f"{max(self.cpu_millis, 0)}m cpu free, instance needs {need.cpu_millis}m")
        if need.memory_mib > self.memory_mib:
            out.append(
                f"{max(self.memory_mib, 0)}Mi memory free, instance needs {need.memory_mib}Mi"
            )
        if need.gpus > self.gpus:
            out.append(f"{max(self.gpus, 0)} gpus free, instance needs {need.gpus}")
        return out

    def __str__(self) -> str:
        return f"{self.cpu_millis}m cpu, {self.memory_mib}Mi memory, {self.gpus} gpus"


# The slot descriptors ``Res.__init__`` sets the fields through (a frozen
# dataclass forbids plain assignment).
_set_cpu = Res.__dict__["cpu_millis"].__set__
_set_mem = Res.__dict__["memory_mib"].__set__
_set_gpus = Res.__dict__["gpus"].__set__


#: Res values made lately by ``interned``, by their components.
_INTERNED: dict[tuple[int, int, int], Res] = {}
#: ``_INTERNED`` starts afresh when it holds this many (a bound on memory)
_INTERNED_MAX = 4096


def interned(cpu_millis: int, memory_mib: int, gpus: int) -> Res:
    """``Res(cpu_millis, memory_mib, gpus)``, shared with an equal one made
    lately when there is one.

    Res arithmetic runs for every placement, probe answer and allocation,
    and mostly gives values seen before (instance sizes, the few totals of a
    node); a frozen slotted Res costs several times a dict lookup to build.
    A Res is immutable and compared by value, so sharing one is invisible.
    Only whole-int components are shared (1.0 == 1 must not give a Res of
    ints for one of floats).
    """
    key = (cpu_millis, memory_mib, gpus)
    r = _INTERNED.get(key)
    if r is not None and type(cpu_millis) is int is type(memory_mib) is type(gpus):
        return r
    r = Res(cpu_millis, memory_mib, gpus)
    if type(cpu_millis) is int is type(memory_mib) is type(gpus):
        if len(_INTERNED) >= _INTERNED_MAX:
            _INTERNED.clear()
        _INTERNED[key] = r
    return r


def _u32(v: int) -> int:
    return min(max(v, 0), _UINT32_MAX)
