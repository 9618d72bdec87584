"""The chart's stack as containers on one user-defined network: started from tests/images/pods.py's
`docker run` commands, made ready by the chart's own probes, and removed afterwards (also when a
test fails). Every wait has a deadline and says what it waited for and what the container logged."""

from __future__ import annotations

import dataclasses
import ipaddress
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gearshift.testing.certs import StackCertificate

from tests.images.pods import ContainerRun

DOCKER_TIMEOUT = 180  # seconds for one docker command (a `docker run` of a large image on a busy machine)
READY_TIMEOUT = 300  # seconds from `docker run` to ready, for any container


class DockerError(AssertionError):
    pass


def docker(*args: str, timeout: float = DOCKER_TIMEOUT, check: bool = True) -> subprocess.CompletedProcess:
    """One docker CLI command; a failure raises with the command and what it printed."""
    try:
        result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise DockerError(f"docker {' '.join(args[:3])} ... took over {timeout} s") from error
    if check and result.returncode:
        raise DockerError(f"docker {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    return result


def docker_ready() -> str | None:
    """Why the engine cannot be used, or None when `docker info` answers."""
    if not shutil.which("docker"):
        return "no docker CLI on the PATH (make test-images installs and starts the engine: scripts/docker-engine.sh)"
    result = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=60)
    return None if result.returncode == 0 else f"the docker engine does not answer: {result.stderr.strip()[-500:]}"


@dataclass
class Stack:
    """Containers of one test run, named and labelled with a fresh prefix."""

    runs: dict[str, ContainerRun]
    files_dir: Path
    certificate: StackCertificate | None = None  # the TLS Secret's, when the chart's values turn TLS on
    prefix: str = field(default_factory=lambda: f"gs-{uuid.uuid4().hex[:6]}-")
    started: list[str] = field(default_factory=list)
    ready_seconds: dict[str, float] = field(default_factory=dict)  # component -> docker run to ready
    retired_logs: dict[str, str] = field(default_factory=dict)  # replica -> its log, kept for close()
    _pod_ips: Iterator[str] = field(default_factory=lambda: iter(()), repr=False)  # create_network() fills it

    @property
    def network(self) -> str:
        return f"{self.prefix}net"

    def container(self, component: str) -> str:
        return f"{self.prefix}{self.runs[component].name}"

    def create_network(self) -> None:
        """The run's network, on a subnet the engine picks as it would for any new network: the
        engine assigns addresses from its first half, pod_ip() hands out the second (the engine
        takes an address given with --ip only on a network whose subnet was given)."""
        label = f"gearshift-test={self.prefix}"
        docker("network", "create", "--label", label, f"{self.prefix}probe")
        subnet = docker("network", "inspect", "-f", "{{(index .IPAM.Config 0).Subnet}}", f"{self.prefix}probe").stdout.strip()
        docker("network", "rm", f"{self.prefix}probe")
        engine, ours = ipaddress.ip_network(subnet).subnets(prefixlen_diff=1)
        docker("network", "create", "--label", label, "--subnet", subnet, "--ip-range", str(engine), self.network)
        self._pod_ips = (str(address) for address in ours.hosts())

    def pod_ip(self) -> str:
        """An address on the network for a container whose environment names its pod IP."""
        return next(self._pod_ips)

    def start(self, component: str, image: str | None = None, timeout: float = READY_TIMEOUT) -> float:
        """docker run the component's pod (its init containers first) and wait for its startup (else readiness) probe; returns the seconds that took."""
        run = self.runs[component]
        run.write_files()
        docker("rm", "-f", self.container(component), check=False)
        started = time.monotonic()
        for init in run.inits:  # the pod's init containers, each to its end (the sandbox's waits for its seccomp profile)
            init.write_files()
            docker(*init.command(self.network, self.prefix, detach=False)[1:], timeout=timeout)
        docker(*run.command(self.network, self.prefix, image, ip=self.pod_ip() if run.needs_ip else None)[1:])
        if component not in self.started:
            self.started.append(component)
        self.wait_ready(component, timeout, since=started)
        self.ready_seconds[component] = time.monotonic() - started
        return self.ready_seconds[component]

    def add_replica(self, component: str, replica: str, env: dict[str, str] | None = None, **changes) -> str:
        """Another pod of the component's workload, as a Deployment scaled out runs it: the same
        settings (env overridden by `env`, other ContainerRun fields by `changes`) and the same
        network aliases, so its Services' names answer with it too; the container is named
        <workload>-<replica>. Returns its key in runs, for start(), address() and the rest."""
        run = self.runs[component]
        key = f"{component}-{replica}"
        assert key not in self.runs, f"{key} exists"
        self.runs[key] = dataclasses.replace(run, name=f"{run.name}-{replica}", env={**run.env, **(env or {})}, publish=[], **changes)
        return key

    def retire(self, key: str, timeout: int = 30) -> None:
        """Stops a replica add_replica made (SIGTERM, its drain, then removed) and forgets it; its
        log is kept for close()."""
        docker("stop", "-t", str(timeout), self.container(key), timeout=timeout + 60, check=False)
        self.retired_logs[key] = self.logs(key, tail=2000)
        docker("rm", "-f", "-v", self.container(key), check=False)
        self.runs.pop(key)
        if key in self.started:
            self.started.remove(key)

    def wait_ready(self, component: str, timeout: float = READY_TIMEOUT, since: float | None = None) -> None:
        spec = self.runs[component].spec
        probe = spec.get("startupProbe") or spec.get("readinessProbe")
        assert probe, f"{component}: the chart gives it no startup or readiness probe"
        deadline = (since or time.monotonic()) + timeout
        why = "not probed yet"
        while time.monotonic() < deadline:
            state = self.state(component)
            if state["Status"] != "running":
                raise AssertionError(f"{component} {state['Status']} (exit {state['ExitCode']}) before it was ready:\n{self.logs(component)}")
            why = self.probe(component, probe)
            if why is None:
                return
            time.sleep(0.25)
        raise AssertionError(f"{component} not ready after {timeout:.0f} s (last probe: {why}):\n{self.logs(component)}")

    def probe(self, component: str, probe: dict) -> str | None:
        """Runs one of the chart's probes (grpc, httpGet, exec) against the container: None when it passes, else why not."""
        if "grpc" in probe:
            address = f"{self.ip(component)}:{self.port(component, probe['grpc']['port'])}"
            with grpc.insecure_channel(address) as channel:
                try:
                    reply = health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", "")), timeout=2)
                except grpc.RpcError as error:
                    return f"grpc health {error.code().name}"
            return None if reply.status == health_pb2.HealthCheckResponse.SERVING else f"grpc health {reply.status}"
        if "httpGet" in probe:
            get = probe["httpGet"]
            url = f"{get.get('scheme', 'HTTP').lower()}://{self.ip(component)}:{self.port(component, get['port'])}{get.get('path', '/')}"
            try:
                status = httpx.get(url, timeout=2, verify=False).status_code  # the kubelet checks no certificate
            except httpx.HTTPError as error:
                return f"GET {url}: {type(error).__name__}"
            return None if 200 <= status < 400 else f"GET {url}: {status}"
        if "exec" in probe:
            result = self.exec(component, *probe["exec"]["command"], timeout=probe.get("timeoutSeconds", 10) + 10)
            return None if result.returncode == 0 else f"exec exit {result.returncode}: {(result.stdout + result.stderr).strip()[-300:]}"
        raise AssertionError(f"{component}: unsupported probe {sorted(probe)}")

    def port(self, component: str, port: int | str) -> int:
        """A container port given by number or by the name the chart gives it."""
        if isinstance(port, int):
            return port
        return next(p["containerPort"] for p in self.runs[component].spec["ports"] if p["name"] == port)

    def published(self, component: str, port: int | str) -> str:
        """127.0.0.1:PORT where the host reaches a published container port (ContainerRun.publish)."""
        container_port = self.port(component, port)
        assert container_port in self.runs[component].publish, f"{component}: port {container_port} is not published"
        found = docker("port", self.container(component), f"{container_port}/tcp").stdout.split()
        (address,) = [line for line in found if line.startswith("127.0.0.1:")]
        return address

    def ip(self, component: str) -> str:
        template = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
        return docker("inspect", "-f", template, self.container(component)).stdout.strip()

    def address(self, component: str, port: int | str = "grpc") -> str:
        return f"{self.ip(component)}:{self.port(component, port)}"

    def state(self, component: str) -> dict:
        import json

        return json.loads(docker("inspect", "-f", "{{json .State}}", self.container(component)).stdout)

    def exec(self, component: str, *command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return docker("exec", self.container(component), *command, timeout=timeout, check=False)

    def logs(self, component: str, tail: int = 60) -> str:
        result = docker("logs", "--tail", str(tail), self.container(component), check=False)
        return (result.stdout + result.stderr).strip()

    def close(self, logs_dir: Path | None = None) -> None:
        """Removes every container, the network and the volumes this run created, first keeping
        each container's log in logs_dir (what CI shows after a failure)."""
        if logs_dir:
            logs_dir.mkdir(parents=True, exist_ok=True)
            for component in self.started:
                (logs_dir / f"{component}.log").write_text(self.logs(component, tail=2000))
            for replica, text in self.retired_logs.items():
                (logs_dir / f"{replica}.log").write_text(text)
        containers = docker("ps", "-aq", "--filter", f"label=gearshift-test={self.prefix}", check=False).stdout.split()
        if containers:
            docker("rm", "-f", "-v", *containers, check=False)
        docker("network", "rm", self.network, f"{self.prefix}probe", check=False)
        volumes = docker("volume", "ls", "-q", "--filter", f"name={self.prefix}", check=False).stdout.split()
        if volumes:
            docker("volume", "rm", "-f", *volumes, check=False)
        shutil.rmtree(self.files_dir, ignore_errors=True)
