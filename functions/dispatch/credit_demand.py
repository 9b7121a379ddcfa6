"""How many capacity credits a Dispatch instance asks to hold: as many as
its starts need, within [floor, ceiling]. Pure: no I/O, time from an
injected clock.

Every credit held costs a GrantCredits exchange per life (its renewal, or
its refill once spent) whether or not a start uses it. At a low start rate
four credits of four starts each are renewed about every 30 s with one or
two starts per life (docs/simulator-costs.md, "Idle cost"): most of those
exchanges buy nothing. So the count follows demand:

- **floor** credits are held while scale-ups happen at all (the wallet's
  ``idle_s`` still returns them all when none comes), so the first starts
  of a burst find one and skip the Schedule hop. Two by default: on the
  Azure 2019 sample's hour one credit (four starts) missed 117 of 33.1k
  starts, two 88, four (the old fixed count) 79;
- a take that found **no credit** (a miss: the start goes through Schedule)
  means demand outran what is held: the count goes to ``ceiling`` at once,
  as the wallet held before;
- a take after which **no credit held could serve another start at once**
  (each has used up its room or has a start in flight) asks one credit
  more at once: a start rate the held credits barely keep up with, or a
  burst that would queue behind as many sandbox creators as credits held.
  At a steady low rate this is the take that spends the last credit with
  room, and the refill then brings two in one exchange;
- after ``shrink_s`` without either, one credit fewer is asked for. Credits
  already held are kept until they are spent or expire, so what is held
  comes down no faster than credits are used up or expire (a credit's
  life, 30 s by default): a quiet spell between bursts does not undo at
  once what the last burst needed.
"""

from __future__ import annotations

from controlplane.runtime.clock import Clock, MonotonicClock


class CreditDemand:
    """The number of credits to hold (see the module docstring)."""

    def __init__(
        self,
        *,
        floor: int = 2,
        ceiling: int = 4,
        shrink_s: float = 10.0,
        clock: Clock | None = None,
    ) -> None:
        if floor < 0 or ceiling < 0:
            raise ValueError("floor and ceiling must be >= 0")
        if shrink_s <= 0:
            raise ValueError("shrink_s must be > 0")
        self.ceiling = ceiling
        self.floor = min(floor, ceiling)
        self.shrink_s = shrink_s
        self.clock = clock or MonotonicClock()
        self._level = self.floor
        # When the level last grew or stepped down: the next step down is
        # due shrink_s after it.
        self._since = self.clock.now()
        #: counters: grew (at a miss or a take that used up the room), shrank
        self.stats: dict[str, int] = dict.fromkeys(("grew", "shrank"), 0)

    def took(self, *, hit: bool, room_left: bool) -> None:
        """A scale-up asked the wallet: ``hit`` whether a credit served it,
        ``room_left`` whether a credit held could serve another start of
        the same size at once (room for it, no start in flight there)."""
        now = self.clock.now()
        self._decay(now)
        if not hit:
            level = self.ceiling
        elif not room_left:
            level = min(self.ceiling, self._level + 1)
        else:
            return
        if level > self._level:
            self.stats["grew"] += 1
            self._level = level
        self._since = now

    def target(self) -> int:
        """Credits to hold now."""
        self._decay(self.clock.now())
        return self._level

    def _decay(self, now: float) -> None:
        if self._level <= self.floor:
            return
        steps = int((now - self._since) // self.shrink_s)
        if steps > 0:
            self._level = max(self.floor, self._level - steps)
            self._since += steps * self.shrink_s
            self.stats["shrank"] += steps
