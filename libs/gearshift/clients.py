"""Client channels between services: the bearer token, message limits, and a request id
that follows a request from service to service."""

from __future__ import annotations

import grpc

from gearshift.interceptors import REQUEST_ID_KEY, request_id
from gearshift.settings import Settings, get_settings


class _Metadata:
    """Adds the token and the request id to a call's metadata."""

    def __init__(self, token: str | None):
        self._auth = (("authorization", f"Bearer {token}"),) if token else ()

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = list(details.metadata or ())
        metadata.extend(self._auth)
        rid = request_id.get()
        if rid != "-":
            metadata.append((REQUEST_ID_KEY, rid))
        return details._replace(metadata=metadata)


# grpc.aio files each interceptor under the first call shape it implements (an if/elif on its
# base classes), so one object implementing all four would only ever see unary-unary calls and
# streaming calls (executor Solve, store Export) would go out without the token: one per shape.
class _UnaryUnary(_Metadata, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._details(details), request)


class _UnaryStream(_Metadata, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._details(details), request)


class _StreamUnary(_Metadata, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


class _StreamStream(_Metadata, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


def metadata_interceptors(token: str | None) -> list:
    """Client interceptors adding the token and request id to calls of every shape."""
    return [shape(token) for shape in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)]


def channel(address: str, settings: Settings | None = None) -> grpc.aio.Channel:
    """An aio channel to another gearshift service, carrying the configured token."""
    settings = settings or get_settings()
    size = settings.limits.max_message_bytes
    options = [("grpc.max_receive_message_length", size), ("grpc.max_send_message_length", size)]
    return grpc.aio.insecure_channel(address, options=options, interceptors=metadata_interceptors(settings.token()))


def service_channel(service: str, settings: Settings | None = None) -> grpc.aio.Channel:
    """A channel to a platform service by name ("store", "sandbox", ...)."""
    settings = settings or get_settings()
    return channel(settings.address_of(service), settings)
