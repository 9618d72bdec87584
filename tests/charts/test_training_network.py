"""The training pods' network across nodes: RDMA devices and NCCL's network variables only when
the values ask for them, in a Job's pod and a TrainJob's alike."""

from __future__ import annotations

import pytest
import yaml

from tests.charts.k8s import named, render, validate_trainjob
from tests.charts.test_chart import TRAINER_API, TRAINJOB, name, node_pod, of_kind

NETWORK = (
    "training.network.rdma.resources.rdma/ib=1",
    "training.network.rdma.ipcLock=true",
    "training.network.nccl.socketIfname=eth0",
    "training.network.nccl.ibHca=mlx5_0\\,mlx5_1",
    "training.network.nccl.ibGidIndex=3",
)


def trainjob_parts(sets: tuple[str, ...]) -> tuple[dict, dict, dict]:
    """(resourcesPerNode, env by name, the node container's securityContext) of the rendered TrainJob."""
    (trainjob,) = of_kind(render((TRAINJOB,), sets, (TRAINER_API,)), "TrainJob")
    validate_trainjob(trainjob)
    trainer = trainjob["spec"]["trainer"]
    env = {item["name"]: item.get("value") for item in trainer["env"]}
    (container,) = node_pod(trainjob)["spec"]["containers"]
    return trainer["resourcesPerNode"], env, container["securityContext"]


def job_parts(sets: tuple[str, ...]) -> tuple[dict, dict, dict]:
    """The same of the worker's Job template (launcher job, one pod)."""
    template = yaml.safe_load(named(render((), sets), "ConfigMap", name("training-job"))["data"]["job.yaml"])
    (container,) = template["spec"]["template"]["spec"]["containers"]
    return container["resources"], {item["name"]: item.get("value") for item in container["env"]}, container["securityContext"]


@pytest.mark.parametrize("parts", [trainjob_parts, job_parts], ids=["trainjob", "job"])
def test_nothing_of_the_network_is_asked_or_set_by_default(parts):
    resources, env, security = parts(())
    assert not any(key.startswith("rdma/") for key in {**resources["limits"], **resources["requests"]})
    assert not any(key in env for key in ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_IB_DISABLE", "NCCL_NET_GDR_LEVEL"))
    assert "add" not in security.get("capabilities", {})


@pytest.mark.parametrize("parts", [trainjob_parts, job_parts], ids=["trainjob", "job"])
def test_rdma_devices_and_nccl_network_variables_when_the_values_ask(parts):
    resources, env, security = parts(NETWORK)
    assert resources["limits"]["rdma/ib"] == 1 and resources["requests"]["rdma/ib"] == 1
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1" and env["NCCL_IB_GID_INDEX"] == "3"
    assert "NCCL_IB_DISABLE" not in env  # not given: not set
    assert security["capabilities"]["add"] == ["IPC_LOCK"] and security["capabilities"]["drop"] == ["ALL"]


def test_training_env_wins_over_the_nccl_values():
    _, env, _ = trainjob_parts(("training.network.nccl.socketIfname=eth0", "training.env.NCCL_SOCKET_IFNAME=ib0"))
    assert env["NCCL_SOCKET_IFNAME"] == "ib0"


def test_a_misspelt_network_value_is_refused():
    from tests.charts.k8s import HelmError

    with pytest.raises(HelmError, match="socketIfName"):
        render((), ("training.network.nccl.socketIfName=eth0",))
