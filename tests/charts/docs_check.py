"""What keeps the docs true (tests/charts/test_docs.py): the commands README.md, docs/*.md and the
example values files' headers give, checked against the command line's own parser and the chart
as helm renders it.

Where commands are found: lines of code blocks (fenced, or indented four spaces), comment lines of
the values files' headers, and inline code spans, that start with `gearshift`, `helm` or `kubectl`
(after a `$ ` prompt, VAR=value assignments or `.venv/bin/`), or a `$(...)` substitution of one
inside another command; a line ending in `\\` goes on. A
command ends at a shell operator (`|`, `&&`, `;`, `&`, a redirection) or a `#` comment.
Placeholders are `<...>` (any one value) and `...` (the rest left out).

- `gearshift ...`: parsed by the command line's click parser (nothing runs): an unknown command
  or option, a bad value, a missing argument (in code; an inline span may leave them out) fails.
- `helm template|install|upgrade`: rendered (`helm template` with its release, namespace, values
  files and --set values) and must succeed. A values file that is not in the repository (one the
  reader writes from a yaml block) leaves the command unrendered.
- `kubectl`: needs `-n` (but for cluster-wide objects), and the objects it names (`svc/NAME`,
  `secret NAME`, ...) must be ones a render renders; a Secret it creates must be one a render's
  pods use (their values name it) and not one the chart makes.
- Object names: an inline span that is a single name starting with `gearshift-` (or a claim's
  `data-gearshift-`) names an object of release `gearshift` and must be rendered, unless it is an
  image (skaffold.yaml, scripts/build-*.sh), a gateway model or a shipped checkpoint's id; one
  written `<release>-gearshift-...` is refused (release `gearshift` renders `gearshift-...`).

The renders are the chart with its defaults, each helm command the docs give and each yaml block
of chart values with training runs (tests/charts/test_documented_values.py's, over
values-gpu.yaml); `<...>` in a name matches any run of name characters.
"""

from __future__ import annotations

import json
import re
import shlex
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import click
import yaml
from gearshift.cli import main as cli
from gearshift.services.gateway.translate import MODELS

from tests.charts.k8s import CHART, KUBE_VERSION, ROOT, TRAINER_API, HelmError, api_versions, helm, pod_spec

DOCUMENTS = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md")])
VALUES_FILES = sorted(CHART.glob("values*.yaml"))
PROGRAMS = ("gearshift", "helm", "kubectl")
COMMAND = re.compile(r"^(?:\$ )?(?:[A-Z_][A-Z0-9_]*=\S* )*(?:\.venv/bin/)?(gearshift|helm|kubectl)(?: |$)")
FENCE = re.compile(r"^ *```")
SUBSTITUTION = re.compile(r"\$\(((?:gearshift|helm|kubectl) [^()]*)\)")  # "$(kubectl get secret ...)" inside another command
SPAN = re.compile(r"`([^`\n]+(?:\n[^`\n]+)?)`")
PLACEHOLDER = "<x>"
NAME = re.compile(r"^(?:data-)?gearshift-[a-z0-9<>.-]*[a-z0-9>]$")
RELEASE_PLACEHOLDER = re.compile(r"^(?:[a-z]+-)?<release>-gearshift-")  # `<release>-gearshift-auth`: not what helm names it
OPERATORS = {"|", "||", "&&", ";", "&"}
# kubectl's short kind names -> the kind they name.
KINDS = {
    "svc": "Service", "service": "Service", "services": "Service",
    "deploy": "Deployment", "deployment": "Deployment", "deployments": "Deployment",
    "sts": "StatefulSet", "statefulset": "StatefulSet", "ds": "DaemonSet", "daemonset": "DaemonSet",
    "job": "Job", "jobs": "Job", "cj": "CronJob", "cronjob": "CronJob", "po": "Pod", "pod": "Pod",
    "secret": "Secret", "secrets": "Secret", "cm": "ConfigMap", "configmap": "ConfigMap",
    "pvc": "PersistentVolumeClaim", "persistentvolumeclaim": "PersistentVolumeClaim",
    "ing": "Ingress", "ingress": "Ingress", "hpa": "HorizontalPodAutoscaler", "pdb": "PodDisruptionBudget",
    "netpol": "NetworkPolicy", "networkpolicy": "NetworkPolicy", "sa": "ServiceAccount", "serviceaccount": "ServiceAccount",
}
CLUSTER_WIDE = {"namespace", "namespaces", "ns", "node", "nodes", "no", "crd", "crds", "clusterrole", "storageclass", "sc"}
CLUSTER_VERBS = {"config", "cluster-info", "version", "api-resources", "api-versions", "cordon", "uncordon", "drain", "taint"}
KUBECTL_VALUE_FLAGS = {"-n", "--namespace", "-l", "--selector", "-o", "--output", "-c", "--container", "--context", "-f", "--filename",
                      "--type", "-p", "--patch", "--image", "--timeout"}
HELM_VALUE_FLAGS = {"-f", "--values", "--set", "--set-string", "--set-json", "--set-file", "-n", "--namespace", "--api-versions"}
HELM_OTHER_VALUE_FLAGS = {"--timeout", "--version", "--kube-version", "-o", "--output", "--description", "--repo"}


@dataclass(frozen=True)
class Command:
    where: str  # path:line
    text: str
    inline: bool  # an inline code span (may leave out required arguments)


def documents() -> Iterator[tuple[str, str]]:
    """(path relative to the repository, text) of every document the checks read."""
    for path in DOCUMENTS:
        yield str(path.relative_to(ROOT)), path.read_text()
    for path in VALUES_FILES:
        yield str(path.relative_to(ROOT)), path.read_text()


def commands(where: str, text: str) -> Iterator[Command]:
    """The commands of one document (see the module's docstring)."""
    if where.endswith(".yaml"):  # a values file: its comment lines
        lines = [(n, line.strip()[1:].strip()) for n, line in enumerate(text.splitlines(), 1) if re.match(r"^\s*#\s{2,}", line)]
        yield from _joined(where, lines)
        return
    code, prose, fenced = [], [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            prose.append("")
            continue
        if fenced or line.startswith("    "):
            code.append((n, line.strip()))
            prose.append("")
        else:
            prose.append(line)
    yield from _joined(where, code)
    for span in spans("\n".join(prose)):
        if COMMAND.match(span.text):
            yield Command(f"{where}:{span.line}", span.text, inline=True)
        for inner in SUBSTITUTION.findall(span.text):
            yield Command(f"{where}:{span.line}", inner, inline=True)


@dataclass(frozen=True)
class Span:
    line: int
    text: str


def spans(prose: str) -> Iterator[Span]:
    """Inline code spans (one may wrap onto the next line), newlines as spaces."""
    for match in SPAN.finditer(prose):
        yield Span(prose.count("\n", 0, match.start()) + 1, match[1].replace("\n", " ").strip())


def _joined(where: str, lines: list[tuple[int, str]]) -> Iterator[Command]:
    pending: tuple[int, str] | None = None
    for n, line in lines:
        if pending:
            n, line = pending[0], pending[1] + " " + line
            pending = None
        if line.endswith("\\"):
            pending = (n, line[:-1].rstrip())
            continue
        if COMMAND.match(line):
            yield Command(f"{where}:{n}", line, inline=False)
        for inner in SUBSTITUTION.findall(line):
            yield Command(f"{where}:{n}", inner, inline=False)


def split(command: str) -> list[str]:
    """The command's words up to its end (a shell operator or redirection), placeholders made one
    word, assignments and the prompt dropped."""
    words = shlex.split(re.sub(r"<[^<>\n]*>", PLACEHOLDER, command), comments=True)
    for index, word in enumerate(words):
        if word in OPERATORS or re.match(r"^\d?>", word) or word.startswith("<") and word != PLACEHOLDER:
            words = words[:index]
            break
    words = [word.removeprefix("[").removesuffix("]") for word in words]  # [--optional parts] count as given
    while words and (words[0] == "$" or re.match(r"^[A-Z_][A-Z0-9_]*=", words[0])):
        words = words[1:]
    if words and words[0].endswith("/gearshift"):
        words[0] = "gearshift"
    return words


def check_gearshift(words: list[str], inline: bool) -> str | None:
    """Why the click parser refuses `gearshift <words>`, or None. Nothing runs: only contexts are made."""
    if "..." in words:  # the rest left out
        words, inline = words[:words.index("...")], True
    command, context, name, rest = cli, None, "gearshift", words
    try:
        while True:
            if isinstance(command, click.Group) and not rest:  # a group named alone: a mention
                return None
            context = command.make_context(name, list(rest), parent=context)
            if not isinstance(command, click.Group):
                return None
            rest = [*context._protected_args, *context.args]
            if not rest or rest[0] == PLACEHOLDER:
                return None
            name, command, rest = command.resolve_command(context, rest)
    except click.exceptions.Exit:  # --help
        return None
    except click.MissingParameter as error:
        return None if inline else error.format_message()
    except click.BadParameter as error:
        if PLACEHOLDER in words or isinstance(getattr(error.param, "type", None), (click.Path, click.File)):
            return None  # a placeholder, or a file the reader has and this checkout does not
        return error.format_message()
    except click.UsageError as error:
        return error.format_message()


@dataclass(frozen=True)
class HelmRender:
    """One `helm template` of the chart: its arguments, made from a documented command."""

    release: str
    namespace: str
    values: tuple[str, ...]  # absolute paths
    sets: tuple[tuple[str, str], ...]  # (flag, pair)
    apis: tuple[str, ...]


def helm_render(words: list[str]) -> HelmRender | str | None:
    """The render a `helm template|install|upgrade` command asks for; a string says why it cannot
    be one; None: not such a command, or it names a values file the reader writes."""
    if len(words) < 2 or words[1] not in ("template", "install", "upgrade"):
        return None
    positional, values, sets, apis, namespace = [], [], [], [], "default"
    index = 2
    while index < len(words):
        word = words[index]
        flag, _, attached = word.partition("=")
        if flag in HELM_VALUE_FLAGS or flag in HELM_OTHER_VALUE_FLAGS:
            value = attached if attached else (words[index + 1] if index + 1 < len(words) else "")
            index += 1 if attached else 2
            if value == PLACEHOLDER:
                continue
            if flag in ("-f", "--values"):
                path = next((p for p in (ROOT / value, CHART / value) if p.is_file()), None)
                if path is None:
                    return None
                values.append(str(path))
            elif flag in ("-n", "--namespace"):
                namespace = value
            elif flag == "--api-versions":
                apis.append(value)
            elif flag.startswith("--set"):
                sets.append((flag, value))
            continue
        if not word.startswith("-"):
            positional.append(word)
        index += 1
    if len(positional) != 2:
        return f"helm {words[1]}: {len(positional)} positional arguments, not a release and a chart"
    release, chart = positional
    if (ROOT / chart).resolve() != CHART.resolve():
        return f"helm {words[1]}: chart {chart} is not charts/gearshift"
    named = tuple(str(Path(v).relative_to(CHART)) for v in values if Path(v).is_relative_to(CHART))
    return HelmRender(release, namespace, tuple(values), tuple(sets), tuple(apis) or api_versions(named))


@dataclass
class Rendered:
    """What the renders hold: (kind, name) of every object, the Secrets their pods use, and the
    claims their StatefulSets make."""

    objects: set[tuple[str, str]] = field(default_factory=set)
    used_secrets: set[str] = field(default_factory=set)
    given_secrets: set[str] = field(default_factory=set)  # used by a render's pods and not made by that render

    def add(self, docs) -> None:
        made = {doc["metadata"]["name"] for doc in docs if doc["kind"] == "Secret"}
        used = set()
        for doc in docs:
            self.objects.add((doc["kind"], doc["metadata"]["name"]))
            if doc["kind"] == "StatefulSet":
                for claim in doc["spec"].get("volumeClaimTemplates", []):
                    self.objects.add(("PersistentVolumeClaim", f"{claim['metadata']['name']}-{doc['metadata']['name']}-0"))
            if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod"):
                used |= pod_secrets(pod_spec(doc))
        self.used_secrets |= used
        self.given_secrets |= used - made

    def has(self, name: str, kind: str | None = None) -> bool:
        pattern = re.compile(re.escape(name).replace(re.escape(PLACEHOLDER), "[a-z0-9.-]+") + "$")
        names = {n for k, n in self.objects if kind in (None, k)}
        if kind in (None, "Secret"):
            names |= self.used_secrets
        return any(pattern.match(n) for n in names)


def pod_secrets(spec: dict) -> set[str]:
    """The Secrets a pod spec uses: env references, envFrom, volumes."""
    found = {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        found |= {s["secretRef"]["name"] for s in container.get("envFrom", []) if "secretRef" in s}
        found |= {e["valueFrom"]["secretKeyRef"]["name"] for e in container.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}
    return found


def render(request: HelmRender) -> tuple[dict, ...]:
    """helm template of the request, once per arguments and values files' contents."""
    values = tuple((path, Path(path).read_text()) for path in request.values)
    return _render_as(request.release, request.namespace, values, request.sets, request.apis)


@lru_cache(maxsize=None)
def _render_as(release: str, namespace: str, values: tuple[tuple[str, str], ...], sets: tuple[tuple[str, str], ...],
               apis: tuple[str, ...]) -> tuple[dict, ...]:
    args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION]
    for version in apis:
        args += ["--api-versions", version]
    for path, _ in values:
        args += ["-f", path]
    for flag, pair in sets:
        args += [flag, pair]
    result = helm(*args)
    if result.returncode:
        raise HelmError(result.stderr.strip())
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def not_objects() -> set[str]:
    """`gearshift-...` names that are no chart object: images, the gateway's models, the shipped
    checkpoint's id."""
    names = set(MODELS)
    for source in (ROOT / "skaffold.yaml", *ROOT.glob("scripts/build-*.sh")):
        names |= set(re.findall(r"\bgearshift-[a-z0-9-]*[a-z0-9]", source.read_text()))
    names.add(json.loads((ROOT / "libs/gearshift/default_policy/training.json").read_text())["checkpoint_id"])
    return names


def kubectl_args(words: list[str]) -> list[str]:
    """A kubectl command's positional words (its verb first), up to `--`, without flags and their values."""
    args, index = [], 1
    while index < len(words) and words[index] != "--":
        word = words[index]
        index += 2 if word in KUBECTL_VALUE_FLAGS else 1
        if not word.startswith("-"):
            args.append(word)
    return args


def check_kubectl(words: list[str], rendered: Rendered, created: set[tuple[str, str]]) -> list[str]:
    """-n, and the objects a kubectl command names (see the module's docstring); created: (kind,
    name) of those the document makes itself."""
    problems = []
    args = kubectl_args(words)
    verb = args[0] if args else ""
    namespaced = verb not in CLUSTER_VERBS and not (len(args) > 1 and args[1] in CLUSTER_WIDE)
    if namespaced and not any(w in ("-n", "--namespace", "-A", "--all-namespaces") or w.startswith("--namespace=") for w in words):
        problems.append("kubectl without -n (the chart's objects live in its release's namespace)")
    for word in args:
        kind, slash, name = word.partition("/")
        if slash and kind in KINDS and not rendered.has(name, KINDS[kind]) and (KINDS[kind], name) not in created:
            problems.append(f"no {KINDS[kind]} {name} in any render of the chart")
    if len(args) >= 3 and args[0] in ("get", "describe", "delete", "edit") and args[1] in KINDS and "$" not in args[2]:
        kind, name = KINDS[args[1]], args[2]
        if not rendered.has(name, kind) and (kind, name) not in created:
            problems.append(f"no {kind} {name} in any render of the chart")
    return problems


MANIFEST = re.compile(r"^\s*kind: (\w+)\s*\n\s*metadata:\s*(?:\{\s*|\n\s*)name: ([a-z0-9.-]+)", re.M)


def manifests(text: str) -> set[tuple[str, str]]:
    """(kind, name) of the objects the document's own manifests make (`kubectl apply -f - <<EOF`)."""
    return set(MANIFEST.findall(text))


def created_secret(words: list[str]) -> str | None:
    """The Secret a `kubectl create secret <type> NAME` makes."""
    args = kubectl_args(words)
    if len(args) >= 4 and args[:2] == ["create", "secret"]:
        return args[3]
    return None


class Checker:
    """Checks documents against the renders of the chart the given documents ask for."""

    def __init__(self, texts: list[tuple[str, str]]):
        from tests.charts.test_documented_values import documented_values

        self.rendered = Rendered()
        self.failed: dict[str, str] = {}  # where -> helm's refusal
        self.rendered.add(_render_as("gearshift", "gearshift", (), (), ()))  # the defaults
        for command in (c for where, text in texts for c in commands(where, text)):
            words = split(command.text)
            request = helm_render(words) if words and words[0] == "helm" else None
            if isinstance(request, HelmRender):
                try:
                    self.rendered.add(render(request))
                except HelmError as error:
                    self.failed[command.where] = str(error)
        folder = Path(tempfile.mkdtemp(prefix="gearshift-docs-values-"))
        for index, (_, values) in enumerate(documented_values()):
            file = folder / f"values-{index}.yaml"
            file.write_text(yaml.safe_dump(values))
            self.rendered.add(render(HelmRender("gearshift", "gearshift", (str(CHART / "values-gpu.yaml"), str(file)), (), (TRAINER_API,))))
        self.not_objects = not_objects()

    def check(self, where: str, text: str) -> list[str]:
        """Every problem of one document, as `path:line: command: why`."""
        problems = []
        found = list(commands(where, text))
        created = {("Secret", name) for c in found if (name := created_secret(split(c.text)))} | manifests(text)
        for command in found:
            try:
                words = split(command.text)
            except ValueError as error:
                problems.append(f"{command.where}: {command.text}: {error}")
                continue
            for why in self._check_command(command, words, created):
                problems.append(f"{command.where}: {command.text}: {why}")
        for span in spans(_prose(text)):
            if RELEASE_PLACEHOLDER.match(span.text):
                problems.append(f"{where}:{span.line}: `{span.text}`: write the name the chart renders for release gearshift (Helm's fullname)")
            if NAME.match(span.text) and span.text not in self.not_objects:
                name = re.sub(r"<[^<>]*>", PLACEHOLDER, span.text)
                if not self.rendered.has(name):
                    problems.append(f"{where}:{span.line}: `{span.text}`: no object of that name in any render of the chart")
        return problems

    def _check_command(self, command: Command, words: list[str], created: set[tuple[str, str]]) -> list[str]:
        if not words or words[0] == "kubectl" and command.inline and len(kubectl_args(words)) < 2 \
                or words[0] == "helm" and command.inline and not [w for w in words[2:] if not w.startswith("-")]:
            return []  # `kubectl logs`, `helm install --wait`: a mention, not a command
        if words[0] == "gearshift":
            why = check_gearshift(words[1:], command.inline)
            return [why] if why else []
        if words[0] == "helm":
            request = helm_render(words)
            if isinstance(request, str):
                return [request]
            if isinstance(request, HelmRender):
                try:
                    render(request)
                except HelmError as error:
                    return [f"helm cannot render it: {str(error)[-400:]}"]
            return []
        problems = check_kubectl(words, self.rendered, created)
        secret = created_secret(words)
        if secret and secret not in self.rendered.used_secrets:
            problems.append(f"Secret {secret}: no values the docs give make the chart's pods use it")
        elif secret and secret not in self.rendered.given_secrets:
            problems.append(f"Secret {secret}: the chart makes it itself")
        return problems


def _prose(text: str) -> str:
    """The text with its code blocks blanked (line numbers kept)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced or line.startswith("    ") else line)
    return "\n".join(lines)
