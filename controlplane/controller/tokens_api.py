"""The controller's token RPCs (CreateToken, ListTokens, DeleteToken,
LookupToken), mixed into ControllerServicer. Who may call them is decided
before they run (``access.decide``: admins, and components for
LookupToken); these methods only act."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc

from controlplane.controller.leaderonly import leader_only
from controlplane.runtime import access, authn
from galaxy.v1 import controller_pb2

if TYPE_CHECKING:
    from controlplane.controller.tokens_store import TokenStore


def info(rec: access.TokenRecord) -> controller_pb2.TokenInfo:
    """The public part of a record (no hash)."""
    return controller_pb2.TokenInfo(
        id=rec.id,
        name=rec.name,
        role=rec.role,
        namespace=rec.namespace,
        created_unix=rec.created_unix,
    )


class TokensApi:
    """Token administration; needs ``tokens`` and, when tokens are checked
    here, ``authenticator`` (its cache forgets a revoked token at once)."""

    tokens: TokenStore
    authenticator: authn.Authenticator | None

    @leader_only
    async def CreateToken(
        self, request: controller_pb2.CreateTokenRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.CreateTokenReply:
        """A new token (its secret in this answer only)."""
        token, rec = await self.tokens.create(request.name, request.role, request.namespace)
        return controller_pb2.CreateTokenReply(info=info(rec), token=token)

    @leader_only
    async def ListTokens(
        self, request: controller_pb2.ListTokensRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.ListTokensReply:
        """Every token's public record."""
        return controller_pb2.ListTokensReply(tokens=[info(r) for r in await self.tokens.records()])

    @leader_only
    async def DeleteToken(
        self, request: controller_pb2.DeleteTokenRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.DeleteTokenReply:
        """Revoke a token."""
        await self.tokens.delete(request.id)
        if self.authenticator is not None:
            self.authenticator.cache.forget(request.id)
        return controller_pb2.DeleteTokenReply()

    async def LookupToken(
        self, request: controller_pb2.LookupTokenRequest, context: Any
    ) -> controller_pb2.TokenRecord:
        """Internal: a token's stored record, for Dispatch (any controller
        answers: it reads the shared store)."""
        rec = await self.tokens.lookup(request.id)
        if rec is None:
            return controller_pb2.TokenRecord(found=False)
        return controller_pb2.TokenRecord(found=True, info=info(rec), sha256=rec.sha256)
