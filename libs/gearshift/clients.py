"""Client channels between services: the bearer token, message limits, and a request id
that follows a request from service to service."""

from __future__ import annotations

import grpc

from gearshift.interceptors import REQUEST_ID_KEY, request_id
from gearshift.settings import Settings, get_settings


class _Metadata(
    grpc.aio.UnaryUnaryClientInterceptor,
    grpc.aio.UnaryStreamClientInterceptor,
    grpc.aio.StreamUnaryClientInterceptor,
    grpc.aio.StreamStreamClientInterceptor,
):
    """Adds the token and the request id to every call, whatever its streaming shape: a call
    shape left out would reach the other service without a token and be refused."""

    def __init__(self, token: str | None):
        self._auth = (("authorization", f"Bearer {token}"),) if token else ()

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = list(details.metadata or ())
        metadata.extend(self._auth)
        rid = request_id.get()
        if rid != "-":
            metadata.append((REQUEST_ID_KEY, rid))
        return details._replace(metadata=metadata)

    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._details(details), request)

    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)

    async def intercept_stream_stream(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


def channel(address: str, settings: Settings | None = None) -> grpc.aio.Channel:
    """An aio channel to another gearshift service, carrying the configured token."""
    settings = settings or get_settings()
    size = settings.limits.max_message_bytes
    options = [("grpc.max_receive_message_length", size), ("grpc.max_send_message_length", size)]
    return grpc.aio.insecure_channel(address, options=options, interceptors=[_Metadata(settings.token())])


def service_channel(service: str, settings: Settings | None = None) -> grpc.aio.Channel:
    """A channel to a platform service by name ("store", "sandbox", ...)."""
    settings = settings or get_settings()
    return channel(settings.address_of(service), settings)
