"""The chart serving the default policy on vLLM with gearshift's A^2FM plugins
(ci/vllm-a2fm-values.yaml): an init container of the training image copies the plugins into a
volume the vLLM container reads, and vLLM's arguments name exactly the files the copy makes."""

from __future__ import annotations

from pathlib import Path

from gearshift import vllm_plugins

from tests.charts.k8s import RELEASE, named, render

A2FM = ("ci/vllm-a2fm-values.yaml",)


def policy_pod(docs) -> dict:
    return named(docs, "Deployment", f"{RELEASE}-policy")["spec"]["template"]["spec"]


def test_the_plugins_are_copied_where_vllms_arguments_name_them(tmp_path):
    pod = policy_pod(render(A2FM))
    init = next(c for c in pod["initContainers"] if c["name"] == "vllm-plugins")
    assert init["command"][:3] == ["python", "-m", "gearshift.vllm_plugins"]
    directory = Path(init["command"][3])
    vllm = pod["containers"][0]
    args = vllm["args"]
    switch, *pairs = vllm_plugins.vllm_args(directory)  # --enable-auto-tool-choice, then flags with a value
    assert switch in args
    for flag, value in zip(pairs[::2], pairs[1::2]):
        assert args[args.index(flag) + 1] == value, flag
    # The files those arguments name are the ones copy_files writes.
    copied = {path.name for path in vllm_plugins.copy_files(tmp_path)}
    named_files = {Path(args[args.index(flag) + 1]).name for flag in ("--tool-parser-plugin", "--reasoning-parser-plugin", "--chat-template")}
    assert named_files <= copied and "parsers" in copied
    mounts = {m["name"]: m for m in vllm["volumeMounts"]}
    assert mounts["vllm-plugins"]["mountPath"] == str(directory) and mounts["vllm-plugins"]["readOnly"]
    assert {m["name"]: m["mountPath"] for m in init["volumeMounts"]} == {"vllm-plugins": str(directory)}
    assert any(v["name"] == "vllm-plugins" and "emptyDir" in v for v in pod["volumes"])


def test_without_the_plugins_nothing_is_copied():
    pod = policy_pod(render(("ci/gpu-agents-a1-values.yaml",)))
    assert all(c["name"] != "vllm-plugins" for c in pod.get("initContainers", []))
    assert "--chat-template" not in pod["containers"][0]["args"]
