"""A blocking client for scripts: ``GalaxyClient`` on a private event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from controlplane.sdk.client import GalaxyClient


class SyncGalaxyClient:
    """Blocking wrapper of GalaxyClient for scripts (one private event loop)."""

    def __init__(self, controller: str | Sequence[str], **kwargs: Any) -> None:
        """controller and kwargs: as ``GalaxyClient``'s."""
        self._runner = asyncio.Runner()
        self._client = self._runner.run(self._make(controller, kwargs))

    @staticmethod
    async def _make(controller: str | Sequence[str], kwargs: dict[str, Any]) -> GalaxyClient:
        return GalaxyClient(controller, **kwargs)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._runner.run(method(*args, **kwargs))

        return call

    def close(self) -> None:
        """Close channels and the loop."""
        self._runner.run(self._client.close())
        self._runner.close()

    def __enter__(self) -> SyncGalaxyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
