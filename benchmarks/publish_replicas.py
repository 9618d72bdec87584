"""Publishing a LoRA checkpoint to every vLLM replica, against publishing to one, in one run on
this machine (not a timed test).

The worker's vllm_lora publish (gearshift.orchestration.publishing.publish_vllm_lora): read the
policy Service's EndpointSlices, then load the adapter in place on every ready pod at once. Two
real vLLM CPU servers stand for the pods (tests/vllm_servers.py), behind a fake Kubernetes API
over HTTP (tests/fake_kubernetes.py); the reference is the same publish with one of them behind
the Service. Each publish alternates between two adapters of SmolLM2 (rank 16), so every load
really replaces the served one; the figure is the median of --rounds after one warm-up.

    .venv/bin/python benchmarks/publish_replicas.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.*: the vLLM launcher and the fake API

import torch  # noqa: E402
from gearshift import weights  # noqa: E402
from gearshift.api.common.v1.common_pb2 import Checkpoint  # noqa: E402
from gearshift.jobs.apo.config import APOConfig  # noqa: E402
from gearshift.orchestration.publishing import publish_vllm_lora  # noqa: E402
from gearshift.policy_client import PolicyClient  # noqa: E402
from gearshift.settings import KubernetesSettings, PolicyClientSettings, Settings  # noqa: E402
from gearshift.training.runtime import Run  # noqa: E402

from tests.fake_kubernetes import fake_kubernetes  # noqa: E402
from tests.vllm_servers import running_vllm_servers  # noqa: E402

ALIAS = "published-policy"
SERVICE = "gearshift-policy"


def adapters(work: Path) -> list[Checkpoint]:
    """Two LoRA checkpoints with different (random) adapters."""
    found = []
    for seed in (1, 2):
        config = APOConfig.model_validate({"model": {"base": "smollm2", "lora": True}, "output": {"dir": str(work / f"run-{seed}")},
                                           "prompts": [{"query": "q", "reference_answer": "a"}]})
        run = Run.start("apo", config)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in run.model.named_parameters():
                if "lora_B" in name:
                    param.copy_(0.01 * torch.randn(param.shape, generator=generator))
        run.save_weights(work / f"checkpoint-{seed}", merged=False)
        found.append(Checkpoint(id=f"apo-{seed}", kind="policy", uri=str(work / f"checkpoint-{seed}"),
                                config_json=json.dumps({"model": {"lora": True}})))
    return found


async def publish_times(urls: list[str], checkpoints: list[Checkpoint], rounds: int) -> list[float]:
    with fake_kubernetes() as kube:
        for url in urls:
            kube.add_endpoint_slice(SERVICE, [("127.0.0.1", True)], ports=[{"name": "http", "port": urlsplit(url).port}])
        settings = Settings(kubernetes=KubernetesSettings(policy_service=SERVICE),
                            policy_client=PolicyClientSettings(url="http://gearshift-policy:8000/v1", model=ALIAS))
        times = []
        for index in range(rounds + 1):
            report = await asyncio.to_thread(lambda c=checkpoints[index % 2]: asyncio.run(publish_vllm_lora(c, settings, kube.api_client)))
            assert len(report.details["pods"]) == len(urls)
            times.append(report.switch_seconds)
    return times[1:]  # the first warms up


async def unload(urls: list[str]) -> None:
    for url in urls:
        async with PolicyClient(url, ALIAS) as policy:
            await policy.unload_lora_adapter(ALIAS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed publishes per case (after one warm-up)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="publish-replicas-") as work:
        checkpoints = adapters(Path(work))
        with running_vllm_servers(2, weights.cache_smollm2(Settings().models_dir), Path(work) / "vllm") as servers:
            urls = servers.urls
            one = asyncio.run(publish_times(urls[:1], checkpoints, args.rounds))
            asyncio.run(unload(urls[:1]))
            two = asyncio.run(publish_times(urls, checkpoints, args.rounds))
    print(f"vllm_lora publish of a rank-16 SmolLM2 adapter, median of {args.rounds} (seconds)")
    print("| replicas | median | min | max |\n|---|---|---|---|")
    for count, times in ((1, one), (2, two)):
        print(f"| {count} | {statistics.median(times):.3f} | {min(times):.3f} | {max(times):.3f} |")
    print(f"2 replicas / 1: {statistics.median(two) / statistics.median(one):.2f}x")
    print(f"\n.venv/bin/python benchmarks/publish_replicas.py --rounds {args.rounds}")


if __name__ == "__main__":
    main()
