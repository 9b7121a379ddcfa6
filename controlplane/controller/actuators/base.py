"""The actuator interface the controller's reconcile loop drives."""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence


class ActuatorError(Exception):
    """Starting or stopping an instance failed; the message says why."""


class Actuator(abc.ABC):
    """Starts and stops instances of a control function kind.

    Kinds are named "dispatch", "schedule", "clustermgr". The controller
    drains an instance (no new traffic, work finished) before it asks the
    actuator to stop it, and waits for new instances to register itself.
    """

    #: Short name shown by `galaxy status`.
    name = "actuator"
    #: Instances outlive this controller process (e.g. a Deployment), so a
    #: newly elected controller adopts the committed targets instead of
    #: starting from what is registered.
    external = False
    #: Called with (kind, instance_id) when an instance this actuator started
    #: ends without being asked to (crash, kill -9): the controller removes
    #: it from membership at once instead of waiting for it to fall silent.
    on_lost: Callable[[str, str], None] | None = None

    async def start(self, controller_address: str) -> None:  # noqa: B027
        """Called once the controller serves at controller_address."""

    @abc.abstractmethod
    async def scale_out(self, kind: str, current: int, desired: int) -> list[str]:
        """Start ``desired - current`` instances of kind. Returns the ids
        they will register with, or [] when the platform names them."""

    @abc.abstractmethod
    def removable(self, kind: str, registered: Sequence[str]) -> list[str]:
        """Which of the registered instance ids this actuator can stop,
        preferred victim first."""

    @abc.abstractmethod
    async def scale_in(self, kind: str, instance_id: str, desired: int) -> None:
        """Stop instance_id (already drained); kind then has desired instances."""

    async def add_standby(self, kind: str, n: int) -> list[str]:
        """Start n warm standby instances of kind (they register as standbys
        and wait for a scale-out to promote them). Returns their ids. An
        actuator without standby support starts none."""
        return []

    async def ensure(self, kind: str, desired: int) -> None:  # noqa: B027
        """Make the platform's target for kind equal desired if it differs
        (a newly elected controller adopting committed targets). Only an
        external actuator has a target of its own to check."""

    async def close(self) -> None:  # noqa: B027
        """Release resources; a local actuator stops what it started."""


class NoActuator(Actuator):
    """Observe only: decisions are shown, nothing is started or stopped."""

    name = "none"

    async def scale_out(self, kind: str, current: int, desired: int) -> list[str]:
        raise ActuatorError("no actuator configured (--actuator none)")

    def removable(self, kind: str, registered: Sequence[str]) -> list[str]:
        return []

    async def scale_in(self, kind: str, instance_id: str, desired: int) -> None:
        raise ActuatorError("no actuator configured (--actuator none)")
