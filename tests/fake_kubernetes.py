"""A fake Kubernetes API server for tests: real HTTP on 127.0.0.1, so the real `kubernetes`
client talks to it exactly as to a cluster (its serialisation, paths, query parameters and
errors all run), with objects held in memory and no controllers. Tests play the controllers'
part through plain methods: set a Job's or TrainJob's status, add its pods with their logs, add
a Service's EndpointSlices, make the next request fail.

    with fake_kubernetes() as kube:
        batch = kubernetes.client.BatchV1Api(kube.api_client)
        batch.create_namespaced_job("default", job)
        kube.set_status("jobs", "train-1", conditions=[condition("Failed", "DeadlineExceeded")])

Served: create (409 AlreadyExists when the name is taken), get (also /status), list (labelSelector
with =, ==, !=, key and !key; fieldSelector on metadata.name and metadata.namespace; the items of
a built-in kind without apiVersion and kind, as a real API server answers them, a CRD's with
them), watch (ADDED, MODIFIED and DELETED events after a resourceVersion, or the objects there
now first when none is given; a resourceVersion older than the last compact() is answered, as the
API server's watch cache answers it, with one ERROR event holding a 410 Expired Status), put,
patch (json-patch, merge-patch and strategic-merge-patch enough for containers/env/volumes keyed
by name; a spec change bumps metadata.generation; a metadata.resourceVersion other than the
stored one is a 409 Conflict), delete (the propagationPolicy is recorded; preconditions on uid or
resourceVersion are a 409 Conflict when they do not hold; dependents, by ownerReference uid, go
with it) and pod logs (tailLines, limitBytes) for ConfigMaps, Pods, Jobs, Deployments,
EndpointSlices and Kubeflow Trainer TrainJobs. Anything else is a Kubernetes Status 404. Every
request is recorded in order.
"""

from __future__ import annotations

import copy
import datetime
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from kubernetes import client

# (group/version, plural) -> kind: the resources this fake serves.
KINDS = {
    ("v1", "configmaps"): "ConfigMap",
    ("v1", "pods"): "Pod",
    ("batch/v1", "jobs"): "Job",
    ("apps/v1", "deployments"): "Deployment",
    ("discovery.k8s.io/v1", "endpointslices"): "EndpointSlice",
    ("trainer.kubeflow.org/v1alpha1", "trainjobs"): "TrainJob",
}
API_VERSIONS = {plural: api_version for api_version, plural in KINDS}
CUSTOM_RESOURCES = {"trainjobs"}  # served from a CRD: their lists keep each item's apiVersion and kind
FIELDS = ("metadata.name", "metadata.namespace")  # the field selectors every kind supports
STATUS_SUBRESOURCE = {"jobs", "deployments", "trainjobs"}  # create ignores their .status, as the API does
ROUTE = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<namespace>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>status|log))?)?$"
)
TRAINJOB_LABEL = "jobset.sigs.k8s.io/jobset-name"  # what Kubeflow Trainer's JobSet puts on a TrainJob's pods


class ApiError(Exception):
    """Answered as a Kubernetes Status object."""

    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


@dataclass
class Request:
    """One request as the server saw it (time is time.monotonic())."""

    method: str
    path: str
    kind: str
    name: str
    time: float
    query: dict[str, str] = field(default_factory=dict)
    body: object = None


@dataclass
class _Event:
    """One change as a watch reports it: the object before (None when created) and after (for a
    deletion, its last state, under the deletion's resourceVersion)."""

    version: int
    type: str  # ADDED, MODIFIED or DELETED
    old: dict | None
    new: dict


@dataclass
class _Failure:
    method: str | None
    kind: str | None
    name: str | None
    code: int | None  # None: the connection is dropped without an answer
    times: int


def condition(type_: str, reason: str = "", message: str = "", status: str = "True") -> dict:
    """A status condition as Job and TrainJob controllers write them."""
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": _now()}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _matches(labels: dict[str, str], selector: str) -> bool:
    """Equality-based label selection: a=b, a==b, a!=b, a (exists), !a (does not)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _merge(target: dict, patch: dict, strategic: bool) -> dict:
    """RFC 7386 merge patch; strategic: lists of objects with a `name` merge item by item, as
    Kubernetes merges containers, env and volumes."""
    for key, value in patch.items():
        current = target.get(key)
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(current, dict):
            _merge(current, value, strategic)
        elif strategic and isinstance(value, list) and isinstance(current, list) and _named(value) and _named(current):
            by_name = {item["name"]: item for item in current}
            for item in value:
                if item["name"] in by_name:
                    _merge(by_name[item["name"]], item, strategic)
                else:
                    current.append(copy.deepcopy(item))
        else:
            target[key] = copy.deepcopy(value)
    return target


def _fields(obj: dict) -> dict[str, str]:
    return {"metadata.name": obj["metadata"]["name"], "metadata.namespace": obj["metadata"]["namespace"]}


def _check_fields(selector: str) -> None:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        field_name = re.split("!=|==|=", term)[0].strip()
        if field_name not in FIELDS:
            raise ApiError(400, "BadRequest", f'field label not supported: {field_name}')


def _resource(plural: str) -> str:
    """A resource as the API's messages name it: jobs.batch, configmaps."""
    group = API_VERSIONS[plural].rpartition("/")[0]
    return f"{plural}.{group}" if group else plural


def _conflict(plural: str, name: str, why: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {_resource(plural)} "{name}": {why}')


def _named(items: list) -> bool:
    return all(isinstance(item, dict) and "name" in item for item in items)


def _json_patch(document: dict, operations: list[dict]) -> dict:
    """RFC 6902's add, replace and remove."""
    for operation in operations:
        *parents, last = [part.replace("~1", "/").replace("~0", "~") for part in operation["path"].split("/")[1:]]
        node = document
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        if isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            if operation["op"] == "remove":
                node.pop(index)
            elif operation["op"] == "add":
                node.insert(index, operation["value"])
            else:
                node[index] = operation["value"]
        elif operation["op"] == "remove":
            node.pop(last, None)
        else:
            node[last] = operation["value"]
    return document


class FakeKubernetes:
    """The in-memory API. Objects are keyed by (group/version, plural, namespace, name)."""

    def __init__(self):
        self.objects: dict[tuple[str, str, str, str], dict] = {}
        self.requests: list[Request] = []
        self.deletions: list[tuple[str, str, str | None]] = []  # (kind, name, propagationPolicy)
        self.logs: dict[tuple[str, str], str | None] = {}  # (namespace, pod) -> text; None: not started
        self.on_create: dict[str, list[Callable[[dict], None]]] = {}  # kind -> hooks run after each create
        self._failures: list[_Failure] = []
        self._version = 0  # the newest resourceVersion given out
        self._events: list[_Event] = []
        self._compacted = 0  # a watch from before this resourceVersion has expired
        self._stopped = False
        self.lock = threading.RLock()
        self._changes = threading.Condition(self.lock)  # watches wait on it
        self.server: ThreadingHTTPServer | None = None
        self.api_client: client.ApiClient | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    # ------------------------------------------------------------ the store

    def create(self, plural: str, namespace: str, body: dict) -> dict:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name") or ""
        if not name:
            raise ApiError(422, "Invalid", f"{plural}: metadata.name: Required value")
        key = (API_VERSIONS[plural], plural, namespace, name)
        with self.lock:
            if key in self.objects:
                raise ApiError(409, "AlreadyExists", f'{plural} "{name}" already exists')
            obj["apiVersion"], obj["kind"] = key[0], KINDS[key[:2]]
            meta |= {"namespace": namespace, "uid": str(uuid.uuid4()), "creationTimestamp": _now(),
                     "resourceVersion": str(self._next_version()), "generation": 1}
            if plural in STATUS_SUBRESOURCE:
                obj["status"] = {}
            self.objects[key] = obj
            self._record("ADDED", None, obj)
            for hook in self.on_create.get(obj["kind"], []):
                hook(obj)
            return copy.deepcopy(obj)

    def get(self, plural: str, namespace: str, name: str) -> dict:
        with self.lock:
            return copy.deepcopy(self._stored(plural, namespace, name))

    def list(self, plural: str, namespace: str | None = None, label_selector: str = "", field_selector: str = "") -> list[dict]:
        """The objects as stored (apiVersion and kind included, whatever their kind)."""
        _check_fields(field_selector)
        with self.lock:
            return [copy.deepcopy(obj) for (_, kind_plural, ns, _), obj in sorted(self.objects.items())
                    if kind_plural == plural and namespace in (None, ns) and self._selected(obj, label_selector, field_selector)]

    def replace(self, plural: str, namespace: str, name: str, body: dict, subresource: str = "") -> dict:
        with self.lock:
            stored = self._stored(plural, namespace, name)
            self._check_version(stored, (body.get("metadata") or {}).get("resourceVersion"))
            if subresource == "status":
                return self._changed(stored, stored | {"status": body.get("status", {})})
            kept = {k: stored["metadata"][k] for k in ("uid", "creationTimestamp", "namespace", "generation")}
            return self._changed(stored, body | {"apiVersion": stored["apiVersion"], "kind": stored["kind"],
                                                 "metadata": body.get("metadata", {}) | kept, "status": stored.get("status", {})})

    def patch(self, plural: str, namespace: str, name: str, patch, content_type: str, subresource: str = "") -> dict:
        with self.lock:
            stored = self._stored(plural, namespace, name)
            if "json-patch" in content_type:
                patched = _json_patch(copy.deepcopy(stored), patch)
            elif "merge-patch" in content_type:
                patched = _merge(copy.deepcopy(stored), patch, strategic="strategic" in content_type)
            else:
                raise ApiError(415, "UnsupportedMediaType", f"the fake does not apply {content_type}")
            self._check_version(stored, patched["metadata"].get("resourceVersion"))
            if subresource == "status":
                patched = stored | {"status": patched.get("status", {})}
            return self._changed(stored, patched)

    def delete(self, plural: str, namespace: str, name: str, propagation_policy: str | None = None,
               preconditions: dict | None = None) -> dict:
        with self.lock:
            obj = self._stored(plural, namespace, name)
            for field_name, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
                wanted, actual = (preconditions or {}).get(field_name), obj["metadata"][field_name]
                if wanted and wanted != actual:
                    raise _conflict(plural, name, f"Precondition failed: {label} in precondition: {wanted}, {label} in object meta: {actual}")
            self.deletions.append((obj["kind"], name, propagation_policy))
            self._remove(obj)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "kind": plural, "uid": obj["metadata"]["uid"]}}

    def _stored(self, plural: str, namespace: str, name: str) -> dict:
        try:
            return self.objects[(API_VERSIONS[plural], plural, namespace, name)]
        except KeyError:
            raise ApiError(404, "NotFound", f'{plural} "{name}" not found') from None

    def _check_version(self, stored: dict, version: str | None) -> None:
        """A write that names a resourceVersion is refused unless it is the stored one (optimistic
        concurrency: the writer read the object before someone else changed it)."""
        meta = stored["metadata"]
        if version and version != meta["resourceVersion"]:
            raise _conflict(self._plural(stored["kind"]), meta["name"],
                            "the object has been modified; please apply your changes to the latest version and try again")

    def _changed(self, stored: dict, new: dict) -> dict:
        old = copy.deepcopy(stored)
        meta = new["metadata"]
        if new.get("spec") != stored.get("spec"):
            meta["generation"] = stored["metadata"].get("generation", 1) + 1
        meta["resourceVersion"] = str(self._next_version())
        stored.clear()
        stored.update(copy.deepcopy(new))
        self._record("MODIFIED", old, stored)
        return copy.deepcopy(stored)

    def _next_version(self) -> int:
        self._version += 1
        return self._version

    def _record(self, type_: str, old: dict | None, new: dict) -> None:
        self._events.append(_Event(self._version, type_, old, copy.deepcopy(new)))
        self._changes.notify_all()

    def _remove(self, obj: dict) -> None:
        """Deletes the object and, as the garbage collector would, everything it owns."""
        meta = obj["metadata"]
        self.objects.pop((obj["apiVersion"], self._plural(obj["kind"]), meta["namespace"], meta["name"]), None)
        meta["resourceVersion"] = str(self._next_version())
        self._record("DELETED", copy.deepcopy(obj), obj)
        if obj["kind"] == "Pod":
            self.logs.pop((meta["namespace"], meta["name"]), None)
        for dependent in [o for o in self.objects.values()
                          if any(ref.get("uid") == meta["uid"] for ref in o["metadata"].get("ownerReferences") or [])]:
            self._remove(dependent)

    @staticmethod
    def _plural(kind: str) -> str:
        return next(plural for (_, plural), name in KINDS.items() if name == kind)

    @staticmethod
    def _selected(obj: dict, label_selector: str, field_selector: str) -> bool:
        return _matches(obj["metadata"].get("labels") or {}, label_selector) and _matches(_fields(obj), field_selector)

    # ------------------------------------------------------------ watches

    def watch(self, plural: str, namespace: str | None, query: dict[str, str]) -> Iterator[dict]:
        """The events of a watch request, until its timeoutSeconds pass or the fake stops: from
        a resourceVersion, the changes after it; without one (or "0"), the objects there now as
        ADDED, then the changes. A resourceVersion from before the last compact() gets one ERROR
        event, a 410 Expired Status, and the stream ends (the client then lists anew)."""
        labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
        _check_fields(fields)
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or "inf")
        since = query.get("resourceVersion", "")
        with self.lock:
            if since in ("", "0"):
                now = [{"type": "ADDED", "object": obj} for obj in self.list(plural, namespace, labels, fields)]
                return itertools.chain(now, self._follow(self._version, plural, namespace, labels, fields, deadline))
            if not since.isdigit():
                raise ApiError(400, "BadRequest", f'resourceVersion: Invalid value: "{since}"')
            if int(since) < self._compacted:
                expired = ApiError(410, "Expired", f"too old resource version: {since} ({self._compacted})")
                return iter([{"type": "ERROR", "object": expired.status()}])
            return self._follow(int(since), plural, namespace, labels, fields, deadline)

    def _follow(self, cursor: int, plural: str, namespace: str | None, labels: str, fields: str, deadline: float) -> Iterator[dict]:
        while True:
            with self.lock:
                while not (pending := [e for e in self._events if e.version > cursor]) and not self._stopped:
                    if not self._changes.wait(max(0.0, min(deadline - time.monotonic(), 3600))) and time.monotonic() >= deadline:
                        return
                if not pending:
                    return
                cursor = pending[-1].version
                seen = [self._as_seen(e, plural, namespace, labels, fields) for e in pending]
            yield from filter(None, seen)  # written outside the lock: a slow reader holds up no one

    def _as_seen(self, event: _Event, plural: str, namespace: str | None, labels: str, fields: str) -> dict | None:
        """The event as a watch with these selectors sees it: an object that comes to match them
        is ADDED, one that stops matching DELETED."""
        meta = event.new["metadata"]
        if self._plural(event.new["kind"]) != plural or namespace not in (None, meta["namespace"]):
            return None
        now = self._selected(event.new, labels, fields)
        before = event.old is not None and self._selected(event.old, labels, fields)
        if event.type == "MODIFIED" and now != before:
            return {"type": "ADDED" if now else "DELETED", "object": copy.deepcopy(event.new)}
        return {"type": event.type, "object": copy.deepcopy(event.new)} if now else None

    def compact(self) -> None:
        """Forgets the changes so far, as etcd's compaction and the watch cache's window do: a
        watch from a resourceVersion before now has expired (410)."""
        with self.lock:
            self._events.clear()
            self._compacted = self._version

    def stop(self) -> None:
        """Ends every watch."""
        with self.lock:
            self._stopped = True
            self._changes.notify_all()

    # ------------------------------------------------------------ test hooks

    def set_status(self, plural: str, name: str, namespace: str = "default", **status) -> dict:
        """Plays the controller: merges status fields (conditions, succeeded, failed, active, ...)
        into a Job's, TrainJob's or Deployment's status."""
        with self.lock:
            stored = self._stored(plural, namespace, name)
            return self._changed(stored, stored | {"status": (stored.get("status") or {}) | status})

    def add_pod(self, owner: str, index: int = 0, log: str | None = "", namespace: str = "default",
                trainjob: bool = False, name: str = "") -> dict:
        """A pod of a Job (label job-name=<owner>) or of a TrainJob (JobSet's labels, the node rank
        as completion index); owned by it, so deleting the owner deletes the pod. log None: the
        container has not started, and reading its log is a 400 as on a cluster."""
        plural = "trainjobs" if trainjob else "jobs"
        owner_obj = self.get(plural, namespace, owner)
        job_name = f"{owner}-node-0" if trainjob else owner
        labels = {"job-name": job_name, "batch.kubernetes.io/job-completion-index": str(index)}
        if trainjob:
            labels |= {TRAINJOB_LABEL: owner, "jobset.sigs.k8s.io/replicatedjob-name": "node", "jobset.sigs.k8s.io/job-index": "0"}
        pod = {"metadata": {
            "name": name or f"{job_name}-{index}-{uuid.uuid4().hex[:5]}", "labels": labels,
            "ownerReferences": [{"apiVersion": owner_obj["apiVersion"], "kind": owner_obj["kind"],
                                 "name": owner, "uid": owner_obj["metadata"]["uid"]}],
        }, "spec": {"containers": [{"name": "node" if trainjob else "train", "image": "fake"}]},
            "status": {"phase": "Pending" if log is None else "Running"}}
        created = self.create("pods", namespace, pod)
        self.logs[(namespace, created["metadata"]["name"])] = log
        return created

    def add_endpoint_slice(self, service: str, addresses: list[tuple[str, bool]], ports: list[dict] | None = None,
                           namespace: str = "default") -> dict:
        """An EndpointSlice of a Service: (address, ready) per endpoint."""
        return self.create("endpointslices", namespace, {
            "metadata": {"name": f"{service}-{uuid.uuid4().hex[:5]}", "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": ready}} for address, ready in addresses],
            "ports": ports or [{"name": "http", "port": 8000, "protocol": "TCP"}],
        })

    def fail_next(self, method: str | None = None, kind: str | None = None, name: str | None = None,
                  code: int | None = 503, times: int = 1) -> None:
        """The next matching request(s) fail: a Status with that code, or code None: the
        connection is closed without an answer (the API dropping)."""
        with self.lock:
            self._failures.append(_Failure(method, kind, name, code, times))

    def created(self, kind: str | None = None) -> list[Request]:
        """The successful-or-not POSTs in order (of one kind, when given)."""
        return [r for r in self.requests if r.method == "POST" and kind in (None, r.kind)]

    def _failure_for(self, request: Request) -> _Failure | None:
        with self.lock:
            for failure in self._failures:
                if failure.times > 0 and all(want in (None, got) for want, got in
                                             ((failure.method, request.method), (failure.kind, request.kind), (failure.name, request.name))):
                    failure.times -= 1
                    return failure
        return None

    # ------------------------------------------------------------ HTTP

    def handle(self, method: str, path: str, query: dict[str, str], body, content_type: str):
        """(code, body) of one request; body a dict (JSON), a str (text/plain) or, for a watch,
        an iterator of events (streamed, one JSON line each)."""
        route = ROUTE.match(path)
        if not route:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        api_version = route["core"] or f"{route['group']}/{route['version']}"
        plural, namespace, name, sub = route["plural"], route["namespace"], route["name"], route["sub"]
        if (api_version, plural) not in KINDS or (sub == "log" and plural != "pods") or (name is None and method not in ("GET", "POST")):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        if namespace is None and method != "GET":
            raise ApiError(405, "MethodNotAllowed", f"{method} needs a namespace")
        if method == "POST":
            return 201, self.create(plural, namespace, body)
        if method == "GET" and name is None and query.get("watch", "").lower() in ("1", "t", "true"):  # Go's ParseBool
            return 200, self.watch(plural, namespace, query)
        if method == "GET" and name is None:
            with self.lock:
                items, version = self.list(plural, namespace, query.get("labelSelector", ""), query.get("fieldSelector", "")), self._version
            if plural not in CUSTOM_RESOURCES:  # a built-in kind's list names its kind once, not on each item
                items = [{k: v for k, v in item.items() if k not in ("apiVersion", "kind")} for item in items]
            return 200, {"apiVersion": api_version, "kind": KINDS[(api_version, plural)] + "List",
                         "metadata": {"resourceVersion": str(version)}, "items": items}
        if method == "GET" and sub == "log":
            return 200, self._log(namespace, name, query)
        if method == "GET":
            return 200, self.get(plural, namespace, name)
        if method == "PUT":
            return 200, self.replace(plural, namespace, name, body, sub or "")
        if method == "PATCH":
            return 200, self.patch(plural, namespace, name, body, content_type, sub or "")
        if method == "DELETE":
            policy = query.get("propagationPolicy") or (body or {}).get("propagationPolicy")
            return 200, self.delete(plural, namespace, name, policy, (body or {}).get("preconditions"))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not served")

    def _log(self, namespace: str, pod: str, query: dict[str, str]) -> str:
        self.get("pods", namespace, pod)
        text = self.logs.get((namespace, pod))
        if text is None:
            raise ApiError(400, "BadRequest", f'container in pod "{pod}" is waiting to start: ContainerCreating')
        if "tailLines" in query:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(query["tailLines"]):]) if int(query["tailLines"]) else ""
        if "limitBytes" in query:  # the first bytes of what is left, as the kubelet stops reading
            text = text.encode()[: int(query["limitBytes"])].decode(errors="ignore")
        return text


def _handler(fake: FakeKubernetes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as urllib3's pool expects
        disable_nagle_algorithm = True  # headers and body go out apart: no 40 ms delayed-ACK stall

        def do(self) -> None:
            parts = urlsplit(self.path)
            query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.loads(raw) if raw else None
            route = ROUTE.match(parts.path)
            plural = route["plural"] if route else ""
            kind = next((k for (_, p), k in KINDS.items() if p == plural), plural)
            name = (route["name"] if route else None) or ((body or {}).get("metadata", {}).get("name") if isinstance(body, dict) else None) or ""
            request = Request(self.command, parts.path, kind, name, time.monotonic(), query, body)
            with fake.lock:
                fake.requests.append(request)
            failure = fake._failure_for(request)
            try:
                if failure and failure.code is None:
                    self.close_connection = True
                    self.connection.shutdown(2)  # no answer at all
                    return
                if failure:
                    raise ApiError(failure.code, "ServiceUnavailable", "injected by the test")
                code, answer = fake.handle(self.command, parts.path, query, body, self.headers.get("Content-Type", ""))
            except ApiError as error:
                code, answer = error.code, error.status()
            except Exception as error:  # a bug in the fake or a malformed request: still a Status
                code, answer = 500, ApiError(500, "InternalError", f"{type(error).__name__}: {error}").status()
            if isinstance(answer, Iterator):
                self.stream(answer)
                return
            text = answer if isinstance(answer, str) else json.dumps(answer)
            payload = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if isinstance(answer, str) else "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do

        def stream(self, events: Iterable[dict]) -> None:
            """A watch's answer: chunked, one event a line, each sent as it happens."""
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for event in events:
                    line = (json.dumps(event) + "\n").encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.write(b"0\r\n\r\n")
            except OSError:  # the client went away (it stopped watching)
                self.close_connection = True

        def log_message(self, *args) -> None:  # quiet: the requests are recorded instead
            pass

    return Handler


@contextmanager
def fake_kubernetes() -> Iterator[FakeKubernetes]:
    """A running fake API on a free port, with `api_client` (a real kubernetes ApiClient) pointed
    at it; stopped on exit."""
    fake = FakeKubernetes()
    fake.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    fake.server.daemon_threads = True
    thread = threading.Thread(target=fake.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    configuration = client.Configuration(host=fake.url)
    fake.api_client = client.ApiClient(configuration)
    try:
        yield fake
    finally:
        fake.stop()
        fake.api_client.close()
        fake.server.shutdown()
        fake.server.server_close()
        thread.join(timeout=5)
