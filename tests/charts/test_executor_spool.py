"""The executor's spool on the chart: an emptyDir of its own, sized by executor.spool.sizeLimit,
mounted where the executor is told its spool is (GEARSHIFT_EXECUTOR__SPOOL_DIR)."""

from __future__ import annotations

from tests.charts.k8s import RELEASE, containers, named, pod_spec, render

SPOOL_DIR = "/var/lib/gearshift/executor-spool"


def deployment(component: str, sets: tuple[str, ...] = ()) -> dict:
    return named(render(sets=sets), "Deployment", f"{RELEASE}-{component}")


def test_the_executor_spools_on_an_empty_dir_of_its_own_where_it_is_told_to():
    spec = pod_spec(deployment("executor"))
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    assert volumes["spool"]["emptyDir"] == {"sizeLimit": "2Gi"}
    (executor,) = containers(spec)
    mounts = {mount["name"]: mount["mountPath"] for mount in executor["volumeMounts"]}
    assert mounts["spool"] == SPOOL_DIR and mounts["data"] == "/var/lib/gearshift"
    assert {"name": "GEARSHIFT_EXECUTOR__SPOOL_DIR", "value": SPOOL_DIR} in executor["env"]


def test_the_spool_size_is_a_value_and_no_other_service_has_a_spool():
    spec = pod_spec(deployment("executor", ("executor.spool.sizeLimit=20Gi",)))
    assert {"name": "spool", "emptyDir": {"sizeLimit": "20Gi"}} in spec["volumes"]
    for component in ("router", "store"):
        assert "spool" not in {volume["name"] for volume in pod_spec(deployment(component))["volumes"]}, component
