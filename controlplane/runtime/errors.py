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
