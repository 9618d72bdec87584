"""TLS on the platform's own connections (Settings.tls): gRPC servers and channels, the HTTP
listeners (gateway, built-in policy server) and their clients (docs/operations.md, "TLS").

One certificate serves the whole stack, laid out as cert-manager writes its Secret (tls.crt,
tls.key, ca.crt). Clients check it for tls.server_name rather than the host they dial, so a client
that dials a pod by IP (a sandbox session's replica, a policy replica being published to) still
verifies. gRPC servers pick up a renewed certificate at the next handshake, without a restart."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import grpc

from gearshift.settings import TlsSettings


def _read(path: Path | None, setting: str) -> bytes:
    if path is None:
        raise ValueError(f"tls.enabled needs tls.{setting} (GEARSHIFT_TLS__{setting.upper()})")
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"tls.{setting}: cannot read {path} ({exc.strerror})") from None


def _identity(tls: TlsSettings) -> tuple[bytes, bytes]:
    """This process's (key, certificate chain)."""
    return _read(tls.key_file, "key_file"), _read(tls.cert_file, "cert_file")


def scheme(tls: TlsSettings) -> str:
    return "https" if tls.enabled else "http"


# gRPC


class _RenewedCertificate:
    """gRPC's fetcher of the server certificate, asked at each handshake: a new configuration
    once the files changed (a Secret volume swaps them when cert-manager renews), else None."""

    def __init__(self, tls: TlsSettings):
        self.tls = tls
        self.stamp = self._stamp()

    def _stamp(self) -> tuple[int, ...]:
        files = (self.tls.cert_file, self.tls.key_file, self.tls.ca_file)
        return tuple(os.stat(path).st_mtime_ns if path and os.path.exists(path) else 0 for path in files)

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        ca = _read(self.tls.ca_file, "ca_file") if self.tls.client_auth else None
        return grpc.ssl_server_certificate_configuration([_identity(self.tls)], root_certificates=ca)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        stamp = self._stamp()
        if stamp == self.stamp:
            return None
        try:
            configuration = self.configuration()
        except ValueError:
            return None  # caught mid-swap: keep serving the old one, read again at the next handshake
        self.stamp = stamp
        return configuration


def server_credentials(tls: TlsSettings) -> grpc.ServerCredentials:
    """A gRPC server's credentials; with client_auth, clients must present a certificate the CA signed."""
    fetcher = _RenewedCertificate(tls)
    return grpc.dynamic_ssl_server_credentials(fetcher.configuration(), fetcher, require_client_authentication=tls.client_auth)


def channel_credentials(tls: TlsSettings) -> grpc.ChannelCredentials:
    """A channel's credentials: servers verified against the CA; this process's certificate
    presented to servers that ask (mutual TLS) when it has one."""
    key, chain = _identity(tls) if tls.cert_file and tls.key_file else (None, None)
    return grpc.ssl_channel_credentials(root_certificates=_read(tls.ca_file, "ca_file"), private_key=key, certificate_chain=chain)


def channel_options(tls: TlsSettings) -> list[tuple[str, str]]:
    return [("grpc.ssl_target_name_override", tls.server_name)] if tls.enabled and tls.server_name else []


# HTTP


def uvicorn_options(tls: TlsSettings, ask_clients: bool) -> dict:
    """uvicorn.Config's TLS arguments; ask_clients: require a client certificate when client_auth
    is on (the policy server; the gateway's clients authenticate with API keys instead)."""
    if not tls.enabled:
        return {}
    for setting in ("cert_file", "key_file", "ca_file"):
        _read(getattr(tls, setting), setting)  # a clear error now, not uvicorn's at its first handshake
    options = {"ssl_certfile": str(tls.cert_file), "ssl_keyfile": str(tls.key_file), "ssl_ca_certs": str(tls.ca_file)}
    if ask_clients and tls.client_auth:
        options["ssl_cert_reqs"] = ssl.CERT_REQUIRED
    return options


def client_context(tls: TlsSettings) -> ssl.SSLContext | None:
    """An HTTP client's TLS context (aiohttp's ssl=, httpx's verify=); None with TLS off."""
    if not tls.enabled:
        return None
    context = ssl.create_default_context(cadata=_read(tls.ca_file, "ca_file").decode())
    if tls.cert_file and tls.key_file:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    return context
