"""Errors with a gRPC status: raised by policies and services, mapped to a
clear status and message by the server interceptor (never a traceback)."""

from __future__ import annotations

import grpc


class GalaxyError(Exception):
    """An error the caller should see, with its gRPC status code."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidArgument(GalaxyError):
    """The request is malformed; the message names the field."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(GalaxyError):
    """The named entity does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(GalaxyError):
    """No capacity (no node fits, queue full)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(GalaxyError):
    """Temporarily cannot serve; retry (with backoff)."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(GalaxyError):
    """Did not complete within the caller's deadline."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class FailedPrecondition(GalaxyError):
    """The system is not in a state to do this (e.g. not ready yet)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Unauthenticated(GalaxyError):
    """No valid credentials were presented."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(GalaxyError):
    """The credentials do not allow this."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Internal(GalaxyError):
    """A bug or an unexpected failure on the server."""

    code = grpc.StatusCode.INTERNAL


_BY_CODE: dict[grpc.StatusCode, type[GalaxyError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        ResourceExhausted,
        Unavailable,
        DeadlineExceeded,
        FailedPrecondition,
        Unauthenticated,
        PermissionDenied,
        Internal,
    )
}

#: Outcomes a client may retry (elsewhere, after a backoff): the request was
#: not served and doing it again cannot do it twice.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})
#: A Dispatch request may also be tried again elsewhere after CANCELLED: on
#: the caller's side that status is the server's doing (a caller that
#: cancels gets CancelledError), a Dispatch stopping whose grace ran out on
#: the call, and the request id makes a repeat the same request.
DISPATCH_RETRYABLE = RETRYABLE | {grpc.StatusCode.CANCELLED}


def from_rpc_error(error: grpc.aio.AioRpcError | grpc.RpcError) -> GalaxyError:
    """The typed Galaxy error for a failed RPC, keeping its code and details."""
    code = error.code() if callable(getattr(error, "code", None)) else grpc.StatusCode.UNKNOWN
    details = error.details() if callable(getattr(error, "details", None)) else str(error)
    cls = _BY_CODE.get(code, GalaxyError)
    return cls(details or code.name) if cls is not GalaxyError else GalaxyError(details, code)
