"""Domain errors. Core code raises these; one interceptor maps them to gRPC status codes,
so servicers never set a status by hand."""

from __future__ import annotations

import grpc


class GearshiftError(Exception):
    """Base of all domain errors; the message is shown to the client."""

    code = grpc.StatusCode.INTERNAL


class InvalidArgument(GearshiftError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(GearshiftError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(GearshiftError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(GearshiftError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(GearshiftError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(GearshiftError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(GearshiftError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unimplemented(GearshiftError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Unauthenticated(GearshiftError):
    code = grpc.StatusCode.UNAUTHENTICATED
