"""KubernetesRunner's own overhead on a TrainJob: from the TrainJob's creation to the run's result
in hand, against the fake Kubernetes API over HTTP (tests/fake_kubernetes.py) with the real
kubernetes client, the fake's "controller" marking each TrainJob Complete (and its pod writing
result.json) the moment it is created. What is left is the runner's requests: ConfigMap, TrainJob,
ownership patch, then one look (status, pods, logs) and reading result.json.

    .venv/bin/python benchmarks/kubernetes_runner.py [--runs 20] [--nodes 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.fake_kubernetes

from gearshift.orchestration.runners import KubernetesRunner  # noqa: E402
from gearshift.orchestration.training_run import RunSpec  # noqa: E402
from gearshift.settings import KubernetesSettings  # noqa: E402
from gearshift.training.results import write_result  # noqa: E402

from tests.fake_kubernetes import condition, fake_kubernetes  # noqa: E402


def measure(runs: int, nodes: int) -> tuple[list[float], list[float], int]:
    """(creation-to-result seconds, whole start+wait seconds, API requests per run)."""
    from_creation, whole, requests = [], [], []
    with fake_kubernetes() as kube, tempfile.TemporaryDirectory() as scratch:
        settings = KubernetesSettings(launcher="trainjob", nodes=nodes)
        runner = KubernetesRunner(settings, kube.api_client)
        specs: dict[str, RunSpec] = {}

        def controller(trainjob: dict) -> None:
            name = trainjob["metadata"]["name"]
            write_result(specs[name].output_dir, {"checkpoint_id": name})
            for rank in range(nodes):
                kube.add_pod(name, index=rank, log=f"rank {rank} done\n", trainjob=True)
            kube.set_status("trainjobs", name, conditions=[condition("Complete", "JobsCompleted")])

        kube.on_create["TrainJob"] = [controller]
        for run in range(runs):
            name = f"gearshift-sft-bench{run:04d}"
            output = Path(scratch) / name
            output.mkdir()
            specs[name] = spec = RunSpec(name=name, job="sft", config={"output": {"dir": str(output)}}, output_dir=output)
            before = len(kube.requests)
            began = time.monotonic()
            external_id = runner.start(spec)
            outcome = runner.wait(spec, external_id, lambda _log: None, timeout=60)
            ended = time.monotonic()
            assert outcome.succeeded and outcome.result == {"checkpoint_id": name}, outcome.reason
            created = next(r.time for r in kube.requests[before:] if r.method == "POST" and r.kind == "TrainJob")
            from_creation.append(ended - created)
            whole.append(ended - began)
            requests.append(len(kube.requests) - before)
    return from_creation, whole, int(statistics.median(requests))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=2)
    args = parser.parse_args()
    measure(3, args.nodes)  # warm: imports, the client's first connection
    from_creation, whole, requests = measure(args.runs, args.nodes)
    print(f"TrainJob of {args.nodes} nodes, {args.runs} runs, {requests} API requests a run")
    print(f"creation -> result: median {1000 * statistics.median(from_creation):.1f} ms "
          f"(min {1000 * min(from_creation):.1f}, max {1000 * max(from_creation):.1f})")
    print(f"start + wait:       median {1000 * statistics.median(whole):.1f} ms")


if __name__ == "__main__":
    main()
