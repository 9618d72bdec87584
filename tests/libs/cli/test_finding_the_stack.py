"""The command line finds a `gearshift up` on any ports: `up --base-port` in one process, and
status, solve and trajectories in others with no address set, only the same data directory
(the stack file up writes there); `up` stopping callers before what they call; what a command
says when nothing serves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner
from gearshift.cli import main
from gearshift.settings import Settings, get_settings
from gearshift.stack import STACK_FILE, Stack, stop_tiers
from gearshift.testing.ports import free_port
from gearshift.testing.scripted_policy import instant_policy_process
from gearshift.topology import BY_NAME, POLICY, SERVICE_NAMES, SERVICES, ports

from tests.libs.test_stack import alive, children_of
from tests.workers import FIXED_PORTS

BASE_PORT = 21000  # the stack's ports from here, metrics on port + 1000: below the ephemeral range
PORTS = ports(BASE_PORT)
# The developer's environment without any address: a command must find the stack by itself.
ENV = {key: value for key, value in os.environ.items() if not (key.startswith("GEARSHIFT_") and key.endswith("_ADDR"))
       and key != "GEARSHIFT_POLICY_CLIENT__URL"} | {"GEARSHIFT_LOG_LEVEL": "WARNING"}


def gearshift(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gearshift.cli", *args], env=env, capture_output=True, text=True, timeout=120)


def start_up(env: dict[str, str]) -> subprocess.Popen:
    """`gearshift up --base-port` (its policy: the one env names), once it says it is up."""
    up = subprocess.Popen([sys.executable, "-m", "gearshift.cli", "up", "--no-policy", "--base-port", str(BASE_PORT)],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + 90
    while not any("gearshift is up" in line for line in lines):
        assert up.poll() is None and time.monotonic() < deadline, "".join(lines)
        lines.append(up.stdout.readline())
    return up


def exit_times(up: subprocess.Popen) -> dict[str, float]:
    """Sends up Ctrl-C and watches its services go: name -> when each process had exited."""
    services = {}
    for pid in children_of(up.pid):
        with open(f"/proc/{pid}/cmdline") as cmdline:
            services[cmdline.read().split("\0")[-2]] = pid  # ... -m gearshift.cli serve NAME
    up.send_signal(signal.SIGINT)
    gone: dict[str, float] = {}
    deadline = time.monotonic() + 60
    while len(gone) < len(services) and time.monotonic() < deadline:
        for name, pid in services.items():
            if name not in gone and not alive(pid):
                gone[name] = time.monotonic()
        time.sleep(0.002)
    return gone


@pytest.mark.xdist_group(FIXED_PORTS)
def test_commands_with_no_address_reach_an_up_on_other_ports_which_stops_callers_first(tmp_path):
    data_dir = tmp_path / "data"
    client_env = ENV | {"GEARSHIFT_DATA_DIR": str(data_dir)}
    with instant_policy_process() as policy_url:
        up = start_up(client_env | {"GEARSHIFT_POLICY_CLIENT__URL": policy_url})
        try:
            assert json.loads((data_dir / STACK_FILE).read_text())["addresses"] == {
                name: f"127.0.0.1:{PORTS[name]}" for name in SERVICE_NAMES}

            status = gearshift("status", env=client_env)
            assert status.returncode == 0, status.stdout + status.stderr
            for name in SERVICE_NAMES:
                assert f"127.0.0.1:{PORTS[name]} " in status.stdout and name in status.stdout
            assert f"{policy_url} SERVING" in " ".join(status.stdout.split())  # the policy, from the stack file too

            solved = gearshift("solve", "What is the capital of France?", "--mode", "instant", "--json", env=client_env)
            assert solved.returncode == 0, solved.stderr
            trajectory = json.loads(solved.stdout)
            assert trajectory["answer"] == "Paris"

            listed = gearshift("trajectories", "list", "--json", env=client_env)
            assert listed.returncode == 0, listed.stderr
            assert [row["id"] for row in json.loads(listed.stdout)] == [trajectory["id"]]
        finally:
            gone = exit_times(up)
            out, _ = up.communicate(timeout=60)
    assert up.returncode == 0 and "Traceback" not in out, out
    assert set(gone) == set(SERVICE_NAMES)
    for spec in SERVICES:  # every caller had exited before what it calls
        for callee in set(spec.calls) - {POLICY}:
            assert gone[spec.name] < gone[callee], (spec.name, callee, gone)
    assert not (data_dir / STACK_FILE).exists()

    after = gearshift("status", env=client_env)
    assert after.returncode == 1 and "SERVING" not in after.stdout
    assert "gearshift up" in after.stderr and len(after.stderr.strip().splitlines()) == 1


def test_a_refused_call_names_the_service_its_address_and_gearshift_up_in_one_line(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    failed = gearshift("trajectories", "list", env=ENV | {"GEARSHIFT_DATA_DIR": str(tmp_path), "GEARSHIFT_STORE_ADDR": address})
    assert failed.returncode == 1 and failed.stdout == ""
    assert failed.stderr == (f"Error: cannot reach the store at {address} (connection refused): start the platform with "
                             "`gearshift up`, or set GEARSHIFT_STORE_ADDR to where it serves\n")


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """Runs a gearshift command in this process with the data directory tmp_path and no address set."""
    for key in os.environ:
        if key.startswith("GEARSHIFT_") and key.endswith("_ADDR"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("GEARSHIFT_DATA_DIR", str(tmp_path))
    get_settings.cache_clear()
    yield lambda *args: CliRunner().invoke(main, list(args))
    get_settings.cache_clear()


def write_stack_file(data_dir, pid: int) -> dict[str, str]:
    addresses = {name: f"127.0.0.1:{free_port()}" for name in SERVICE_NAMES}
    (data_dir / STACK_FILE).write_text(json.dumps({"pid": pid, "addresses": addresses, "policy_url": "http://127.0.0.1:1/v1"}))
    return addresses


def test_the_stack_file_of_a_live_up_gives_every_address_no_variable_sets(cli, tmp_path, monkeypatch):
    addresses = write_stack_file(tmp_path, os.getpid())  # this process stands for a live up
    monkeypatch.setenv("GEARSHIFT_STORE_ADDR", "127.0.0.1:1")
    result = cli("status", "--timeout", "0.2")
    settings = get_settings()
    assert settings.store_addr == "127.0.0.1:1"  # a variable wins
    assert {name: settings.address_of(name) for name in SERVICE_NAMES if name != "store"} == {
        name: address for name, address in addresses.items() if name != "store"}
    assert settings.policy_client.url == "http://127.0.0.1:1/v1"
    assert f"gearshift up (pid {os.getpid()}) serves from {tmp_path / STACK_FILE}" in result.output
    assert "its services are down; start the platform with `gearshift up`" in result.output


def test_a_stack_file_left_by_a_dead_up_is_ignored(cli, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid is now no process's
    write_stack_file(tmp_path, dead.pid)
    result = cli("status", "--timeout", "0.2")
    assert get_settings().executor_addr == Settings.model_fields["executor_addr"].default
    assert result.exit_code == 1 and f"no gearshift up serves from {tmp_path}" in result.output


def test_serving_commands_take_no_address_from_a_stack_file(cli, tmp_path):
    write_stack_file(tmp_path, os.getpid())
    cli("serve", "--help")
    assert get_settings().router_addr == f"127.0.0.1:{BY_NAME['router'].port}"


def test_the_table_starts_what_is_called_first_and_stops_callers_first():
    for position, spec in enumerate(SERVICES):
        assert set(spec.calls) - {POLICY} <= set(SERVICE_NAMES[:position]), spec.name
    assert stop_tiers([POLICY, *SERVICE_NAMES, "worker", "beat"]) == [
        ["worker", "beat"], ["gateway"], ["executor"], ["sandbox", "reward", "planner", "router"], [POLICY, "store"]]


def test_a_second_up_on_one_data_directory_is_refused(tmp_path):
    first = subprocess.Popen(["sleep", "30"])  # stands for a live up that wrote the file
    try:
        write_stack_file(tmp_path, first.pid)
        with pytest.raises(RuntimeError, match=f"another gearshift up \\(pid {first.pid}\\) serves from {tmp_path}"):
            Stack(Settings(), data_dir=str(tmp_path)).write_stack_file()
    finally:
        first.kill()
        first.wait()
    Stack(Settings(), data_dir=str(tmp_path)).write_stack_file()  # once it is gone, its file is taken over
    assert json.loads((tmp_path / STACK_FILE).read_text())["pid"] == os.getpid()
