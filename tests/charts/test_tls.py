"""TLS inside the platform (values `tls`), as rendered: one certificate for the whole stack whose
names cover every address a pod is given, the Secret mounted and GEARSHIFT_TLS__* set in every pod
that runs gearshift code, https for the policy API, the kubelet's gRPC probes on the plaintext
health port, vLLM serving HTTPS, the combinations that cannot work refused, and nothing of it
without tls.enabled. Then the chart's scripts (health check, vLLM drain, HTTPS probe) against real
TLS servers with a throwaway CA."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from gearshift.settings import Settings
from gearshift.testing.certs import issue

from tests.charts.k8s import CHART, GRPC_SERVICES, RELEASE, HelmError, component_of, containers, named, of_kind, render, workloads

TLS = "ci/tls-values.yaml"
TLS_DIR = "/etc/gearshift/tls"
SECRET = f"{RELEASE}-internal-tls"
SERVER_NAME = f"{RELEASE}.{RELEASE}.svc"  # <fullname>.<namespace>.svc (release == chart name)
ON = ("tls.enabled=true", "tls.secretName=stack-tls")
MUTUAL = (*ON, "tls.clientAuth=true")
TLS_ENV = {
    "GEARSHIFT_TLS__ENABLED": "true",
    "GEARSHIFT_TLS__CERT_FILE": f"{TLS_DIR}/tls.crt",
    "GEARSHIFT_TLS__KEY_FILE": f"{TLS_DIR}/tls.key",
    "GEARSHIFT_TLS__CA_FILE": f"{TLS_DIR}/ca.crt",
    "GEARSHIFT_TLS__SERVER_NAME": SERVER_NAME,
    "GEARSHIFT_TLS__CLIENT_AUTH": "true",
    "GEARSHIFT_TLS__HEALTH_PORT": "50052",
}


def name(component: str) -> str:
    return f"{RELEASE}-{component}"


def env_of(container: dict) -> dict[str, str | None]:
    return {item["name"]: item.get("value") for item in container.get("env", [])}


def pod_specs(docs) -> list[tuple[str, dict]]:
    """(where, pod spec) of every workload, the worker's training Job template included."""
    found = [(f"{doc['kind']}/{doc['metadata']['name']}", spec) for doc, spec in workloads(docs)]
    template = named(docs, "ConfigMap", name("training-job"))
    if template is not None:
        job = yaml.safe_load(template["data"]["job.yaml"])
        found.append(("training-job template", job["spec"]["template"]["spec"]))
    return found


def tls_files(spec: dict, container: dict) -> dict[str, str]:
    """Path -> key of the TLS Secret's files as this container sees them (read-only mounts only)."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    files = {}
    for mount in container.get("volumeMounts", []):
        secret = volumes.get(mount["name"], {}).get("secret")
        if secret and mount.get("readOnly") and "subPath" not in mount:
            for key in ("tls.crt", "tls.key", "ca.crt"):
                files[f"{mount['mountPath']}/{key}"] = f"{secret['secretName']}:{key}"
    return files


def host_of(address: str) -> str:
    """The host a client dials: dns:///host:port (gRPC), host:port, scheme://host:port/path."""
    address = address.removeprefix("dns:///").partition("://")[2] or address.removeprefix("dns:///")
    return address.split("/")[0].rsplit(":", 1)[0]


@pytest.fixture(scope="module")
def docs():
    return render((TLS,))


def test_tls_is_off_by_default_and_then_nothing_of_it_renders():
    docs = render()
    assert not of_kind(docs, "Certificate")
    for where, spec in pod_specs(docs):
        for container in containers(spec):
            assert not [n for n in env_of(container) if n.startswith("GEARSHIFT_TLS__")], where
            assert "tls" not in {m["name"] for m in container.get("volumeMounts", [])}, where
            assert "grpc-health" not in {p["name"] for p in container.get("ports", [])}, where
        assert "tls" not in {v["name"] for v in spec.get("volumes", [])}, where
    router = named(docs, "Deployment", name("router"))["spec"]["template"]["spec"]["containers"][0]
    assert env_of(router)["GEARSHIFT_POLICY_CLIENT__URL"].startswith("http://")
    assert "tls " not in render_notes()


def test_the_certificate_covers_every_address_the_pods_dial_and_the_server_name(docs):
    (certificate,) = of_kind(docs, "Certificate")
    spec = certificate["spec"]
    assert spec["secretName"] == SECRET
    assert spec["issuerRef"] == {"name": "gearshift-ca", "kind": "Issuer", "group": "cert-manager.io"}
    assert (spec["duration"], spec["renewBefore"]) == ("2160h", "720h")
    assert {"server auth", "client auth"} <= set(spec["usages"])  # every pod is a server and a client
    names = set(spec["dnsNames"])
    assert SERVER_NAME in names
    dialed = set()
    for where, pod in pod_specs(docs):
        for container in containers(pod):
            env = env_of(container)
            dialed |= {host_of(value) for key, value in env.items() if key.endswith("_ADDR") and value}
            if env.get("GEARSHIFT_POLICY_CLIENT__URL"):
                dialed.add(host_of(env["GEARSHIFT_POLICY_CLIENT__URL"]))
            if env.get("GEARSHIFT_TLS__SERVER_NAME"):
                dialed.add(env["GEARSHIFT_TLS__SERVER_NAME"])
    assert {name("store") + "-headless", name("gateway"), name("policy")} <= {h.split(".")[0] for h in dialed}
    assert dialed <= names, sorted(dialed - names)
    # Every Service of a component that serves TLS, headless ones included, by each of its names.
    for service in of_kind(docs, "Service"):
        if component_of(service) in (*GRPC_SERVICES, "gateway", "policy"):
            short = service["metadata"]["name"]
            assert {short, f"{short}.{RELEASE}.svc", f"{short}.{RELEASE}.svc.cluster.local"} <= names, short


def test_every_pod_that_runs_gearshift_code_speaks_tls_with_the_mounted_secret(docs):
    checked = set()
    for where, spec in pod_specs(docs):
        for container in containers(spec):
            env = env_of(container)
            if "GEARSHIFT_AUTH_TOKEN" not in env and not env.get("GEARSHIFT_TLS__ENABLED"):
                continue
            assert {k: env.get(k) for k in TLS_ENV} == TLS_ENV, f"{where}/{container['name']}"
            files = tls_files(spec, container)
            for setting, key in (("CERT_FILE", "tls.crt"), ("KEY_FILE", "tls.key"), ("CA_FILE", "ca.crt")):
                assert files.get(env[f"GEARSHIFT_TLS__{setting}"]) == f"{SECRET}:{key}", f"{where}/{container['name']} {setting}"
            checked.add(where.split("/")[-1])
    expected = {name(c) for c in (*GRPC_SERVICES, "gateway", "worker", "beat", "policy", "health-check")} | {"training-job template"}
    assert expected <= checked, sorted(expected - checked)
    # The migration hook dials no service: no token, no TLS.
    migrate = named(docs, "Job", name("store-migrate"))
    if migrate is not None:
        assert not [n for n in env_of(migrate["spec"]["template"]["spec"]["containers"][0]) if n.startswith("GEARSHIFT_TLS__")]


def test_an_existing_secret_is_mounted_as_it_is_named_and_no_certificate_renders():
    docs = render((), ON)
    assert not of_kind(docs, "Certificate")
    spec = named(docs, "Deployment", name("router"))["spec"]["template"]["spec"]
    (router,) = spec["containers"]
    assert tls_files(spec, router)[f"{TLS_DIR}/ca.crt"] == "stack-tls:ca.crt"
    assert env_of(router)["GEARSHIFT_TLS__CLIENT_AUTH"] == "false"
    named_server = render((), (*ON, "tls.serverName=gearshift.internal"))
    (router,) = named(named_server, "Deployment", name("router"))["spec"]["template"]["spec"]["containers"]
    assert env_of(router)["GEARSHIFT_TLS__SERVER_NAME"] == "gearshift.internal"


def test_the_policy_url_is_https(docs):
    for where, spec in pod_specs(docs):
        for container in containers(spec):
            url = env_of(container).get("GEARSHIFT_POLICY_CLIENT__URL")
            if url is not None:
                assert url == f"https://{name('policy')}:8400/v1", where


def test_grpc_probes_use_the_plaintext_health_port_which_the_container_declares(docs):
    for service in GRPC_SERVICES:
        (container,) = named(docs, "Deployment", name(service))["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["grpc-health"] == 50052 == int(env_of(container)["GEARSHIFT_TLS__HEALTH_PORT"]) and ports["grpc"] == 50051
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert container[probe]["grpc"] == {"port": 50052}, f"{service} {probe}"
        # Only the kubelet asks it: in no Service, and no NetworkPolicy rule (the kubelet probes from the node).
        for svc in (named(docs, "Service", name(service)), named(docs, "Service", f"{name(service)}-headless")):
            assert 50052 not in {p["port"] for p in svc["spec"]["ports"]}
        policy = named(docs, "NetworkPolicy", name(service))
        assert {"grpc-health", 50052}.isdisjoint({p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]})
    moved = render((), (*ON, "ports.health=7000"))
    (container,) = named(moved, "Deployment", name("store"))["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["grpc"]["port"] == 7000 and env_of(container)["GEARSHIFT_TLS__HEALTH_PORT"] == "7000"


def test_the_gateway_serves_https_probed_by_the_kubelet_and_routed_to_by_ingress_nginx(docs):
    deployment = named(docs, "Deployment", name("gateway"))
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    # Mutual or not, the gateway asks its clients for no certificate: the kubelet's httpGet passes.
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http", "scheme": "HTTPS"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http", "scheme": "HTTPS"}
    http, metrics = named(docs, "Service", name("gateway"))["spec"]["ports"]
    assert http["appProtocol"] == "https" and "appProtocol" not in metrics
    (ingress,) = of_kind(docs, "Ingress")
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"] == "HTTPS"
    own = render((TLS,), ('gateway.ingress.annotations.nginx\\.ingress\\.kubernetes\\.io/backend-protocol=GRPCS',))
    assert of_kind(own, "Ingress")[0]["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"] == "GRPCS"
    plain = render((), ("gateway.ingress.enabled=true", "gateway.apiKeys.existingSecret=keys"))
    assert "nginx.ingress.kubernetes.io/backend-protocol" not in (of_kind(plain, "Ingress")[0]["metadata"].get("annotations") or {})


def policy_container(docs) -> dict:
    return named(docs, "Deployment", name("policy"))["spec"]["template"]["spec"]["containers"][0]


def test_the_builtin_policy_server_is_probed_over_https_and_from_inside_under_mutual_tls(docs):
    script = (CHART / "files" / "probe-https.py").read_text()
    mutual = policy_container(docs)  # ci/tls-values.yaml: clientAuth
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert mutual[probe]["exec"]["command"] == [
            "python", "-c", script, "https://127.0.0.1:8400/health", f"{TLS_DIR}/ca.crt", f"{TLS_DIR}/tls.crt", f"{TLS_DIR}/tls.key"]
    assert env_of(mutual)["GEARSHIFT_TLS__CLIENT_AUTH"] == "true"
    server_only = policy_container(render((), ON))
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert server_only[probe]["httpGet"] == {"path": "/health", "port": "http", "scheme": "HTTPS"}


def test_service_monitors_scrape_plaintext_metrics_ports_and_the_policy_over_https(docs):
    (router,) = named(docs, "ServiceMonitor", name("router"))["spec"]["endpoints"]
    (gateway,) = named(docs, "ServiceMonitor", name("gateway"))["spec"]["endpoints"]
    assert router["port"] == gateway["port"] == "metrics" and "scheme" not in router and "tlsConfig" not in gateway
    (policy,) = named(docs, "ServiceMonitor", name("policy"))["spec"]["endpoints"]
    assert policy["port"] == "http" and policy["scheme"] == "https"
    assert policy["tlsConfig"] == {
        "serverName": SERVER_NAME,
        "ca": {"secret": {"name": SECRET, "key": "ca.crt"}},
        "cert": {"secret": {"name": SECRET, "key": "tls.crt"}},  # clientAuth: the policy server asks Prometheus too
        "keySecret": {"name": SECRET, "key": "tls.key"},
    }
    (server_only,) = named(render((), (*ON, "policy.serviceMonitor.enabled=true")), "ServiceMonitor", name("policy"))["spec"]["endpoints"]
    assert set(server_only["tlsConfig"]) == {"serverName", "ca"}


@pytest.mark.parametrize("sets", [MUTUAL, ON], ids=["mutual", "server-only"])
def test_vllm_serves_https_with_the_mounted_certificate(sets):
    docs = render(("values-gpu.yaml",), (*sets, "policy.publishTarget=vllm_lora", "policy.mountCheckpoints=true"))
    pod = named(docs, "Deployment", name("policy"))["spec"]["template"]["spec"]
    vllm = pod["containers"][0]
    args = vllm["args"]
    flags = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--ssl-")}
    files = tls_files(pod, vllm)
    assert files[flags["--ssl-certfile"]] == "stack-tls:tls.crt" and files[flags["--ssl-keyfile"]] == "stack-tls:tls.key"
    assert files[flags["--ssl-ca-certs"]] == "stack-tls:ca.crt"
    mutual = "tls.clientAuth=true" in sets
    assert flags.get("--ssl-cert-reqs") == ("2" if mutual else None)  # ssl.CERT_REQUIRED
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        if mutual:
            assert vllm[probe]["exec"]["command"][0] == "python3" and vllm[probe]["exec"]["command"][3] == "https://127.0.0.1:8000/health"
        else:
            assert vllm[probe]["httpGet"] == {"path": "/health", "port": "http", "scheme": "HTTPS"}
    assert vllm["lifecycle"]["preStop"]["exec"]["command"][3:] == ["8000", "5", f"{TLS_DIR}/ca.crt", f"{TLS_DIR}/tls.crt", f"{TLS_DIR}/tls.key"]
    assert not [n for n in env_of(vllm) if n.startswith("GEARSHIFT_")]  # vLLM reads none of the platform's settings
    # The init container that asks the store for the adapters dials it over TLS.
    (init,) = [c for c in pod["initContainers"] if c["name"] == "startup-adapters"]
    assert env_of(init)["GEARSHIFT_TLS__ENABLED"] == "true" and tls_files(pod, init)[env_of(init)["GEARSHIFT_TLS__KEY_FILE"]] == "stack-tls:tls.key"


def test_vllm_args_carry_no_ssl_flags_without_tls():
    vllm = policy_container(render(("values-gpu.yaml",)))
    assert not [a for a in vllm["args"] if a.startswith("--ssl-")] and "httpGet" in vllm["readinessProbe"]
    assert "scheme" not in vllm["readinessProbe"]["httpGet"]


def test_trainjobs_and_the_helm_test_pod_get_tls_too():
    docs = render(("ci/trainjob-values.yaml",), MUTUAL)
    for trainjob in of_kind(docs, "TrainJob"):
        env = {e["name"]: e.get("value") for e in trainjob["spec"]["trainer"]["env"]}
        assert env["GEARSHIFT_TLS__ENABLED"] == "true"
        (patch,) = trainjob["spec"]["runtimePatches"]
        pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        assert tls_files(pod, pod["containers"][0])[env["GEARSHIFT_TLS__CA_FILE"]] == "stack-tls:ca.crt"
    pod = named(render((), ON), "Pod", name("health-check"))["spec"]
    (container,) = pod["containers"]
    assert f"gateway=https://{name('gateway')}:8100/ready" in container["args"]
    assert tls_files(pod, container)[env_of(container)["GEARSHIFT_TLS__CERT_FILE"]] == "stack-tls:tls.crt"


@pytest.mark.parametrize(
    "sets, message",
    [
        (("tls.enabled=true",), "tls.enabled needs a certificate: set tls.secretName"),
        (("tls.enabled=true", "tls.certManager.enabled=true"), "tls.certManager.enabled needs tls.certManager.issuerRef.name"),
        (("tls.certManager.enabled=true", "tls.certManager.issuerRef.name=ca"), "set tls.enabled=true too"),
    ],
)
def test_tls_combinations_that_cannot_work_are_refused(sets, message):
    with pytest.raises(HelmError, match=message.replace(".", r"\.")):
        render((), sets)


def render_notes(*args: str) -> str:
    from tests.charts.k8s import helm

    result = helm("install", RELEASE, str(CHART), "--dry-run", "--namespace", RELEASE, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.partition("NOTES:")[2]


def test_notes_say_tls_is_on_and_which_secret():
    notes = render_notes("-f", str(CHART / TLS))
    (line,) = [line for line in notes.splitlines() if line.strip().startswith("tls ")]
    assert "on (mutual)" in line and SECRET in line and SERVER_NAME in line
    assert "OPENAI_BASE_URL=https://api.gearshift.example.com/v1" in notes and f"https://{name('policy')}:8400/v1" in notes


def test_the_schema_refuses_a_misspelt_tls_key():
    with pytest.raises(HelmError, match="clientauth|additional"):
        render((), ("tls.clientauth=true",))


# ---------------------------------------------------------------- the scripts, over real TLS


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, str]:
    """A throwaway CA and one certificate it signed for SERVER_NAME (server and client usages), as
    cert-manager writes them: ca.crt, tls.crt, tls.key; and a stranger CA that signed nothing here."""
    cert, stranger = issue(tmp_path_factory.mktemp("pki"), names=(SERVER_NAME,), ips=()), issue(tmp_path_factory.mktemp("stranger"))
    return {"ca.crt": str(cert.ca), "tls.crt": str(cert.cert), "tls.key": str(cert.key), "stranger.crt": str(stranger.ca)}


def tls_env(pki: dict[str, str], server_name: str = SERVER_NAME) -> dict[str, str]:
    return os.environ | {
        "GEARSHIFT_TLS__ENABLED": "true", "GEARSHIFT_TLS__CERT_FILE": pki["tls.crt"], "GEARSHIFT_TLS__KEY_FILE": pki["tls.key"],
        "GEARSHIFT_TLS__CA_FILE": pki["ca.crt"], "GEARSHIFT_TLS__SERVER_NAME": server_name, "GEARSHIFT_TLS__CLIENT_AUTH": "true",
    }


def https_server(pki: dict[str, str], answers: dict[str, tuple[int, str]]) -> ThreadingHTTPServer:
    """HTTPS on loopback that requires a client certificate of the CA (mutual TLS), answering
    path -> (status, body); bodies may be lists, answered in turn (the last one for good)."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = answers.get(self.path, (404, ""))
            if isinstance(body, list):
                body = body.pop(0) if len(body) > 1 else body[0]
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki["tls.crt"], pki["tls.key"])
    context.load_verify_locations(pki["ca.crt"])
    context.verify_mode = ssl.CERT_REQUIRED
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_the_https_probe_passes_on_2xx_with_the_pods_certificate_and_fails_otherwise(pki):
    script = str(CHART / "files" / "probe-https.py")
    server = https_server(pki, {"/health": (200, "ok"), "/unready": (503, "")})
    base = f"https://127.0.0.1:{server.server_address[1]}"
    try:
        def probe(path: str, ca: str = pki["ca.crt"], cert: str = pki["tls.crt"]) -> int:
            return subprocess.run([sys.executable, script, base + path, ca, cert, pki["tls.key"]], capture_output=True, timeout=30).returncode

        assert probe("/health") == 0
        assert probe("/unready") == 1
        assert probe("/health", ca=pki["stranger.crt"]) == 1  # a server the CA did not sign
    finally:
        server.shutdown()


def test_the_vllm_drain_asks_over_https_with_the_pods_certificate(pki):
    from tests.charts.test_chart import vllm_metrics

    script = (CHART / "files" / "drain-vllm.py").read_text()
    bodies = [vllm_metrics(1, 0), vllm_metrics(0, 0)]
    server = https_server(pki, {"/metrics": (200, bodies)})
    try:
        done = subprocess.run([sys.executable, "-c", script, str(server.server_address[1]), "0", pki["ca.crt"], pki["tls.crt"], pki["tls.key"]],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert bodies == [vllm_metrics(0, 0)]  # it asked until idle: the busy answer went, over mutual TLS
    finally:
        server.shutdown()


def grpc_health_server(pki: dict[str, str]):
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    credentials = grpc.ssl_server_credentials([(Path(pki["tls.key"]).read_bytes(), Path(pki["tls.crt"]).read_bytes())],
                                              root_certificates=Path(pki["ca.crt"]).read_bytes(), require_client_auth=True)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, port


def test_the_health_check_speaks_mutual_tls_and_checks_the_server_name(pki):
    script = str(CHART / "files" / "check-health.py")
    grpc_server, grpc_port = grpc_health_server(pki)
    http_server = https_server(pki, {"/ready": (200, "")})
    targets = [f"router=127.0.0.1:{grpc_port}", f"gateway=https://127.0.0.1:{http_server.server_address[1]}/ready"]
    try:
        ok = subprocess.run([sys.executable, script, "5", *targets], env=tls_env(pki), capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0 and ok.stdout.count("SERVING") == 2, ok.stdout + ok.stderr
        # The certificate is not for the name asked for: both refused.
        wrong = subprocess.run([sys.executable, script, "3", *targets], env=tls_env(pki, "other.example"), capture_output=True, text=True,
                               timeout=60)
        assert wrong.returncode == 1 and "SERVING" not in wrong.stdout.replace("NOT_SERVING", ""), wrong.stdout
        assert "DOWN (UNAVAILABLE)" in wrong.stdout and "DOWN (SSLCertVerificationError)" in wrong.stdout, wrong.stdout
    finally:
        grpc_server.stop(None)
        http_server.shutdown()


def test_the_pods_tls_env_is_what_gearshift_reads(docs, monkeypatch):
    """The router's environment read as gearshift reads it."""
    (router,) = named(docs, "Deployment", name("router"))["spec"]["template"]["spec"]["containers"]
    for item in router["env"]:
        monkeypatch.setenv(item["name"], item.get("value", "from-a-secret"))
    tls = Settings().tls
    assert tls.enabled is True and tls.client_auth is True and tls.health_port == 50052
    assert (str(tls.cert_file), str(tls.key_file), str(tls.ca_file)) == (f"{TLS_DIR}/tls.crt", f"{TLS_DIR}/tls.key", f"{TLS_DIR}/ca.crt")
    assert tls.server_name == SERVER_NAME
    assert Settings().policy_client.url.startswith("https://")
