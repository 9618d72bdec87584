"""TLS on the platform's own connections, over real loopback sockets with certificates a
throwaway CA signed (gearshift.testing.certs): gRPC services refuse plaintext and unknown CAs,
mutual TLS refuses a client without a certificate, the plaintext health port serves only health,
a renewed certificate is served without a restart, and the whole embedded platform (gateway,
every service, the built-in policy server) answers over TLS end to end."""

from __future__ import annotations

import shutil
import socket
import ssl

import aiohttp
import grpc
import httpx
import pytest
from gearshift import weights
from gearshift.api.common.v1.common_pb2 import Mode
from gearshift.api.router.v1 import router_pb2, router_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.server import running
from gearshift.services.router.service import build
from gearshift.settings import ExecutorSettings, TlsSettings
from gearshift.testing.certs import issue
from gearshift.testing.ports import free_port
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROUTE = router_pb2.RouteRequest(query="hi", forced_mode=Mode.MODE_INSTANT)


@pytest.fixture(scope="module")
def stack_cert(tmp_path_factory):
    return issue(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def other_cert(tmp_path_factory):
    """A certificate from another CA (another cluster's, an attacker's)."""
    return issue(tmp_path_factory.mktemp("other"))


def with_tls(settings, tls: TlsSettings):
    return settings.model_copy(update={"tls": tls})


async def route(address: str, settings) -> grpc.StatusCode:
    async with channel(address, settings) as ch:
        try:
            await router_pb2_grpc.RouterStub(ch).Route(ROUTE, timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def served_serial(port: int, cert) -> int:
    """The serial number of the certificate the server presents at a new handshake."""
    context = ssl.create_default_context(cafile=cert.ca)
    context.load_cert_chain(cert.cert, cert.key)
    context.check_hostname = False
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, context.wrap_socket(raw) as tls_socket:
        return int(tls_socket.getpeercert()["serialNumber"], 16)


async def test_grpc_over_tls_refuses_plaintext_and_unknown_cas(settings, stack_cert, other_cert):
    secured = with_tls(settings, stack_cert.settings())
    async with running(await build(secured), secured) as server:
        address = f"127.0.0.1:{server.port}"
        assert await route(address, secured) == grpc.StatusCode.OK
        assert await route(address, settings) == grpc.StatusCode.UNAVAILABLE  # plaintext
        assert await route(address, with_tls(settings, other_cert.settings())) == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_refuses_a_client_without_a_certificate(settings, stack_cert):
    secured = with_tls(settings, stack_cert.settings(client_auth=True))
    async with running(await build(secured), secured) as server:
        address = f"127.0.0.1:{server.port}"
        assert await route(address, secured) == grpc.StatusCode.OK
        anonymous = TlsSettings(enabled=True, ca_file=stack_cert.ca)  # trusts the CA, presents nothing
        assert await route(address, with_tls(settings, anonymous)) == grpc.StatusCode.UNAVAILABLE


async def test_clients_check_the_server_name_rather_than_the_host_dialed(settings, tmp_path):
    named = issue(tmp_path, names=("gearshift.test",), ips=())  # no IP: dialing 127.0.0.1 alone cannot verify
    secured = with_tls(settings, named.settings())
    async with running(await build(secured), secured) as server:
        address = f"127.0.0.1:{server.port}"
        assert await route(address, secured) == grpc.StatusCode.UNAVAILABLE
        assert await route(address, with_tls(settings, named.settings(server_name="gearshift.test"))) == grpc.StatusCode.OK


async def test_the_health_port_is_plaintext_and_serves_only_health(settings, stack_cert):
    health_port = free_port()
    secured = with_tls(settings, stack_cert.settings(client_auth=True, health_port=health_port))
    async with running(await build(secured), secured) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{health_port}") as kubelet:
            reply = await health_pb2_grpc.HealthStub(kubelet).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await router_pb2_grpc.RouterStub(kubelet).Route(ROUTE, timeout=5)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        await server.stop(grace=0.1)
        with pytest.raises(OSError):  # stopped with the service
            socket.create_connection(("127.0.0.1", health_port), timeout=2).close()


async def test_a_renewed_certificate_is_served_at_the_next_handshake(settings, tmp_path):
    served, renewed = issue(tmp_path / "served"), issue(tmp_path / "renewed")
    secured = with_tls(settings, served.settings())
    async with running(await build(secured), secured) as server:
        before = served_serial(server.port, served)
        for name in ("tls.crt", "tls.key", "ca.crt"):  # what a Secret volume does when cert-manager renews
            shutil.copy(renewed.directory / name, served.directory / name)
        assert served_serial(server.port, renewed) not in (before, None)
        assert await route(f"127.0.0.1:{server.port}", with_tls(settings, renewed.settings())) == grpc.StatusCode.OK


async def test_tls_without_its_files_fails_at_start_with_the_setting_named(settings):
    broken = with_tls(settings, TlsSettings(enabled=True))
    with pytest.raises(ValueError, match=r"tls\.enabled needs tls\.\w+_file \(GEARSHIFT_TLS__\w+_FILE\)"):
        async with running(await build(broken), broken):
            pass


@pytest.mark.model
async def test_the_embedded_platform_serves_over_tls_end_to_end(settings, stack_cert):
    """The gateway, every gRPC service and the built-in policy server with mutual TLS: a chat
    completion over HTTPS, the policy server refusing plaintext and a client without a certificate."""
    secured = with_tls(settings, stack_cert.settings(client_auth=True)).model_copy(
        update={"executor": ExecutorSettings(max_tokens_per_turn=24, max_steps_other=1)})
    async with embedded(secured, policy_model=weights.DEFAULT) as platform:
        policy_url = platform.settings.policy_client.url
        assert policy_url.startswith("https://")
        gateway = platform.settings.gateway_addr
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=stack_cert.ca), timeout=300) as client:
            reply = await client.post(f"https://{gateway}/v1/chat/completions",
                                      json={"model": "gearshift-instant", "messages": [{"role": "user", "content": "Say hi."}]})
            assert reply.status_code == 200, reply.text
            assert reply.json()["gearshift"]["mode"] == "instant"
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://{gateway}/health", timeout=5)

        health = policy_url.removesuffix("/v1") + "/health"
        with pytest.raises(httpx.TransportError):  # plaintext
            httpx.get(health.replace("https://", "http://"), timeout=5)
        with pytest.raises((httpx.TransportError, ssl.SSLError)):  # trusts the CA, presents no certificate
            httpx.get(health, verify=ssl.create_default_context(cafile=stack_cert.ca), timeout=5)
        async with aiohttp.ClientSession() as session:  # with the certificate: served
            context = ssl.create_default_context(cafile=stack_cert.ca)
            context.load_cert_chain(stack_cert.cert, stack_cert.key)
            async with session.get(health, ssl=context) as response:
                assert response.status == 200
