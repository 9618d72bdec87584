"""The executor's spool on the chart: an emptyDir of its own, sized by executor.spool.sizeLimit,
or one claim every executor pod shares (executor.spool.persistence), mounted where the executor
is told its spool is (GEARSHIFT_EXECUTOR__SPOOL_DIR)."""

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


def test_with_persistence_every_executor_pod_spools_on_one_shared_claim_the_chart_keeps():
    sets = ("executor.spool.persistence.enabled=true", "executor.spool.persistence.storageClass=nfs")
    spec = pod_spec(deployment("executor", sets))
    claim = named(render(sets=sets), "PersistentVolumeClaim", f"{RELEASE}-executor-spool")
    assert {"name": "spool", "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}} in spec["volumes"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"] and claim["spec"]["storageClassName"] == "nfs"
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"  # it may hold acknowledged trajectories
    (executor,) = containers(spec)
    assert {"name": "GEARSHIFT_EXECUTOR__SPOOL_DIR", "value": SPOOL_DIR} in executor["env"]


def test_an_existing_claim_is_used_and_none_is_created():
    sets = ("executor.spool.persistence.enabled=true", "executor.spool.persistence.existingClaim=spool-nfs")
    objects = render(sets=sets)
    assert {"name": "spool", "persistentVolumeClaim": {"claimName": "spool-nfs"}} in pod_spec(named(objects, "Deployment", f"{RELEASE}-executor"))["volumes"]
    assert not [o for o in objects if o["kind"] == "PersistentVolumeClaim" and "spool" in o["metadata"]["name"]]
