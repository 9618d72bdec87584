"""Where a training run executes: a subprocess on this machine (the embedded default) or, on a
cluster, a Kubernetes Job (one node) or Kubeflow Trainer TrainJob (across nodes). Both are
re-attachable: start() on a run that was already started (a task redelivered after a worker
crash) finds it instead of starting a second one; on a cluster, start() on a run whose last
attempt failed starts a new attempt (see KubernetesRunner).

Every run is `gearshift train <job> --config FILE` (`python -m gearshift.jobs.<job>` locally),
writing its checkpoint directory with a result.json and registering it in the store.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import yaml

from gearshift.orchestration.training_manifests import (
    RESOURCES,
    RUN_LABEL,
    attempt_of,
    build_config_map,
    build_run,
    config_map_name,
    pod_selector,
    rank_order,
    run_kind,
    verdict,
)
from gearshift.orchestration.training_run import RunSpec
from gearshift.settings import KubernetesSettings, Settings
from gearshift.training.results import RESULT_FILE, read_result

LOG_TAIL_CHARS = 64_000


@dataclass
class RunOutcome:
    """How a run ended: its exit, the tail of its log, and its result.json when readable here."""

    succeeded: bool
    external_id: str
    log: str = ""
    result: dict | None = None
    reason: str = ""
    extra: dict = field(default_factory=dict)


Heartbeat = Callable[[str], None]  # called with the log tail while a run is watched


class Runner(Protocol):
    def start(self, spec: RunSpec) -> str:
        """Starts the run, or finds it started; returns its external id."""

    def wait(self, spec: RunSpec, external_id: str, heartbeat: Heartbeat, timeout: float) -> RunOutcome:
        """Watches the run to its end (stopping it when the timeout passes)."""

    def cancel(self, spec: RunSpec, external_id: str) -> None:
        """Stops the run."""


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - LOG_TAIL_CHARS))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


class LocalRunner:
    """A subprocess in its own session, its output in <run dir>/train.log and its exit status in
    <run dir>/exit_code (written by a shell wrapper, so a worker that adopts the run after a
    crash still learns how it ended)."""

    def __init__(self, runs_dir: Path, poll_seconds: float = 0.5, env: dict[str, str] | None = None):
        self.runs_dir = Path(runs_dir)
        self.poll_seconds = poll_seconds
        self.env = env or {}

    def run_dir(self, spec: RunSpec) -> Path:
        return self.runs_dir / spec.name

    def command(self, spec: RunSpec, config_path: Path) -> list[str]:
        return [sys.executable, "-m", f"gearshift.jobs.{spec.job}", "--config", str(config_path)]

    def start(self, spec: RunSpec) -> str:
        run_dir = self.run_dir(spec)
        run_dir.mkdir(parents=True, exist_ok=True)
        if self._alive(run_dir) or (run_dir / "exit_code").exists():
            return str(run_dir)  # started before (a redelivered task): watch that one
        config_path = run_dir / "config.yaml"
        config_path.write_text(yaml.safe_dump(spec.config, sort_keys=False))
        command = " ".join(shlex.quote(part) for part in self.command(spec, config_path))
        wrapper = f'{command} >> train.log 2>&1; echo $? > exit_code.tmp && mv exit_code.tmp exit_code'
        process = subprocess.Popen(
            ["/bin/sh", "-c", wrapper], cwd=run_dir, env=os.environ | self.env, start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        (run_dir / "pid").write_text(str(process.pid))
        return str(run_dir)

    def wait(self, spec: RunSpec, external_id: str, heartbeat: Heartbeat, timeout: float) -> RunOutcome:
        run_dir = Path(external_id)
        deadline = time.monotonic() + timeout
        while not (run_dir / "exit_code").exists():
            if time.monotonic() > deadline:
                self.stop(run_dir)
                return RunOutcome(False, external_id, _tail(run_dir / "train.log"), reason=f"timed out after {timeout:.0f} s")
            if not self._alive(run_dir) and not (run_dir / "exit_code").exists():
                time.sleep(self.poll_seconds)  # the wrapper may be renaming exit_code right now
                if not (run_dir / "exit_code").exists():
                    return RunOutcome(False, external_id, _tail(run_dir / "train.log"), reason="the run's process vanished")
            heartbeat(_tail(run_dir / "train.log"))
            time.sleep(self.poll_seconds)
        code = int((run_dir / "exit_code").read_text().strip() or 1)
        log = _tail(run_dir / "train.log")
        result = read_result(spec.output_dir)
        if code != 0:
            return RunOutcome(False, external_id, log, result, reason=f"exit status {code}")
        if result is None:
            return RunOutcome(False, external_id, log, reason=f"no {RESULT_FILE} in {spec.output_dir}")
        return RunOutcome(True, external_id, log, result)

    def cancel(self, spec: RunSpec, external_id: str) -> None:
        self.stop(Path(external_id))

    def stop(self, run_dir: Path) -> None:
        pid = self._pid(run_dir)
        if pid:
            try:
                os.killpg(pid, signal.SIGTERM)  # the wrapper leads its own session
            except ProcessLookupError:
                pass

    @staticmethod
    def _pid(run_dir: Path) -> int | None:
        try:
            return int((run_dir / "pid").read_text())
        except (OSError, ValueError):
            return None

    def _alive(self, run_dir: Path) -> bool:
        pid = self._pid(run_dir)
        if not pid:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A zombie child of this process counts as ended: reap it.
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            return done == 0
        except ChildProcessError:
            return True


# ---------------------------------------------------------------- Kubernetes


def kube_api_client():
    """A Kubernetes API client: the pod's service account in a cluster, else the kubeconfig
    ($KUBECONFIG as it is now: the client library reads it once, at import), each on a
    configuration of its own rather than the library's global one."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration, persist_config=False)
    return client.ApiClient(configuration)


def _transient(error: Exception) -> bool:
    """An API error worth looking again after: throttling, a server error, a dropped connection."""
    import urllib3
    from kubernetes.client.rest import ApiException

    if isinstance(error, ApiException):
        return error.status == 429 or error.status >= 500
    return isinstance(error, urllib3.exceptions.HTTPError)


def _api_message(error: Exception) -> str:
    """The message of the Status object an API error carries (else the error's own text)."""
    try:
        return json.loads(error.body)["message"]
    except (AttributeError, TypeError, ValueError, KeyError):
        return str(error)


class KubernetesRunner:
    """Each attempt of a run is one object, a batch/v1 Job or a Kubeflow Trainer TrainJob
    (training_manifests.run_kind), named attempt_name(run, attempt), its --config in a ConfigMap
    that the object owns.

    start(spec) decides from the cluster, so the Runner protocol needs no attempt number: it
    lists the run's objects (label gearshift.io/training-run) and takes the newest attempt. One
    still running or succeeded is re-attached to (a redelivered task never starts a second
    copy); one failed or being deleted makes attempt N+1 (a retried run starts anew instead of
    watching its old failure until the TTL removes it); none makes attempt 1. The ConfigMap is
    created before the object, so no pod ever waits for its config, and owned by it afterwards,
    so deleting the object removes it. A start that died between the two finds the ConfigMap
    (409) and reuses it; one that died before taking ownership takes it on re-attaching.

    wait() ends on the object's conditions (Failed, with its reason and message, or Complete),
    tolerates a briefly unavailable API, and on timeout deletes the object (Foreground: its pods
    go first). Both kinds go through CustomObjectsApi, which speaks to any group/version/plural
    (batch/v1 jobs with the very requests BatchV1Api sends) and answers plain dicts.
    """

    def __init__(self, settings: KubernetesSettings, api_client=None):
        from kubernetes import client

        api_client = api_client or kube_api_client()
        self.settings = settings
        self.core = client.CoreV1Api(api_client)
        self.objects = client.CustomObjectsApi(api_client)
        self.kind = run_kind(settings)
        group, version, plural = RESOURCES[self.kind]
        self.api_version = f"{group}/{version}"
        self.resource = (group, version, settings.namespace, plural)  # every CustomObjectsApi call's first arguments

    def start(self, spec: RunSpec) -> str:
        latest = self._latest_attempt(spec)
        ended = verdict(latest) if latest else None
        if latest and (ended is None or ended.succeeded):  # running or done: re-attach
            self._own_config_map(latest)
            return latest["metadata"]["name"]
        attempt = attempt_of(latest) + 1 if latest else 1
        run = build_run(spec, self.settings, attempt)
        self._put_config_map(spec, run, attempt)
        created = self._create(run)
        self._own_config_map(created)
        return created["metadata"]["name"]

    def wait(self, spec: RunSpec, external_id: str, heartbeat: Heartbeat, timeout: float) -> RunOutcome:
        from kubernetes.client.rest import ApiException

        deadline = time.monotonic() + timeout
        log = ""
        while True:
            try:
                # The object itself, status included: the /status subresource needs RBAC of its own.
                obj = self.objects.get_namespaced_custom_object(*self.resource, external_id)
                log = self.logs(external_id)
                ended = verdict(obj)
            except Exception as error:
                if isinstance(error, ApiException) and error.status == 404:
                    return RunOutcome(False, external_id, log, reason=f"{self.kind} {external_id} no longer exists")
                if not _transient(error):
                    raise
                ended = None  # the API is briefly away: look again next time
            if ended and ended.succeeded:
                return RunOutcome(True, external_id, log, read_result(spec.output_dir))
            if ended:
                return RunOutcome(False, external_id, log, reason=ended.reason)
            if time.monotonic() > deadline:
                return RunOutcome(False, external_id, log, reason=f"timed out after {timeout:.0f} s; {self._cancelled(spec, external_id)}")
            heartbeat(log)
            time.sleep(self.settings.poll_seconds)

    def cancel(self, spec: RunSpec, external_id: str) -> None:
        """Deletes the attempt's object, its pods first (Foreground), and with it its ConfigMap."""
        from kubernetes.client.rest import ApiException

        try:
            self.objects.delete_namespaced_custom_object(*self.resource, external_id, propagation_policy="Foreground")
        except ApiException as error:
            if error.status != 404:
                raise

    def logs(self, name: str) -> str:
        """Every pod's log, rank 0 first, each under a header line naming the pod; each pod gets
        an equal share of settings.log_tail_bytes."""
        pods = self.core.list_namespaced_pod(self.settings.namespace, label_selector=pod_selector(self.kind, name)).items
        share = self.settings.log_tail_bytes // max(len(pods), 1)
        return "\n".join(f"==> pod {pod.metadata.name} <==\n{self._pod_log(pod.metadata.name, share)}"
                         for pod in sorted(pods, key=rank_order))

    def _pod_log(self, pod: str, share: int) -> str:
        """The end of a pod's log in at most `share` characters. The API cuts limitBytes from the
        start of the tail it was asked for, so the tail asked for is about a share of lines (at
        64 bytes a line) with room to spare, and its end is kept here."""
        from kubernetes.client.rest import ApiException

        try:
            answer = self.core.read_namespaced_pod_log(pod, self.settings.namespace, tail_lines=max(10, share // 64),
                                                       limit_bytes=4 * share, _preload_content=False)
        except ApiException as error:  # a pod still pulling its image has no log yet
            return f"(no log: {_api_message(error)})"
        # Read raw: the client turns a "str" response into the text of a bytes object ("b'...'").
        return answer.data.decode(errors="replace")[-share:]

    def _latest_attempt(self, spec: RunSpec) -> dict | None:
        listed = self.objects.list_namespaced_custom_object(*self.resource, label_selector=f"{RUN_LABEL}={spec.name}")
        latest = max(listed.get("items") or [], key=attempt_of, default=None)
        # An API server names a built-in kind once on the list, not on its items (a JobList's
        # Jobs come without apiVersion and kind; a CRD's items keep them): the object gets them back.
        return {"apiVersion": self.api_version, "kind": self.kind} | latest if latest else None

    def _create(self, run: dict) -> dict:
        from kubernetes.client.rest import ApiException

        try:
            return self.objects.create_namespaced_custom_object(*self.resource, run)
        except ApiException as error:
            if error.status != 409:
                raise
            return self.objects.get_namespaced_custom_object(*self.resource, run["metadata"]["name"])  # a concurrent start's

    def _put_config_map(self, spec: RunSpec, run: dict, attempt: int) -> None:
        """Creates the attempt's ConfigMap. One already there without an owner is a crashed
        start's: reused. One with an owner belonged to an object of this name now gone (the
        garbage collector has yet to remove it): replaced, so it cannot vanish under the new one."""
        from kubernetes.client.rest import ApiException

        namespace = self.settings.namespace
        config_map = build_config_map(spec, run["metadata"]["labels"], attempt)
        try:
            self.core.create_namespaced_config_map(namespace, config_map)
            return
        except ApiException as error:
            if error.status != 409:
                raise
        name = config_map["metadata"]["name"]
        if not self.core.read_namespaced_config_map(name, namespace).metadata.owner_references:
            return
        self.core.delete_namespaced_config_map(name, namespace)
        self.core.create_namespaced_config_map(namespace, config_map)

    def _own_config_map(self, obj: dict) -> None:
        """Makes the ConfigMap a dependent of the object: deleted with it."""
        from kubernetes.client.rest import ApiException

        meta = obj["metadata"]
        owner = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"], "uid": meta["uid"]}
        try:
            self.core.patch_namespaced_config_map(config_map_name(meta["name"]), self.settings.namespace,
                                                  {"metadata": {"ownerReferences": [owner]}})
        except ApiException as error:
            if error.status != 404:  # an object of before this change whose ConfigMap went: nothing to own
                raise

    def _cancelled(self, spec: RunSpec, external_id: str) -> str:
        try:
            self.cancel(spec, external_id)
        except Exception as error:
            return f"deleting {self.kind} {external_id} failed: {type(error).__name__}: {error}"
        return f"{self.kind} {external_id} deleted"


def make_runner(settings: Settings) -> Runner:
    """The runner the settings ask for."""
    if settings.orchestration.runner == "kubernetes":
        return KubernetesRunner(settings.kubernetes)
    return LocalRunner(settings.data_dir / "runs")
