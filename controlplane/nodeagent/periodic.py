"""A node agent's periodic checks (orphans, private directories): one
background task that runs ``check`` every ``period_s`` until stopped, a
failed check logged and the next one run."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

log = logging.getLogger(__name__)


class Periodic:
    """Runs ``self.check()`` every ``period_s`` in the background."""

    #: The task's name and the log's word for a failed check.
    name = "periodic check"
    period_s: float

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    async def check(self) -> Any:
        """One check (subclasses)."""
        raise NotImplementedError

    def start(self) -> None:
        """Start checking in the background."""
        self._task = asyncio.create_task(self._loop(), name=self.name)

    async def stop(self) -> None:
        """Stop checking."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            # Periodic by nature: what is checked announces nothing.
            await asyncio.sleep(self.period_s)
            try:
                await self.check()
            except Exception:
                log.exception("%s failed", self.name)
