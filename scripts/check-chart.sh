#!/usr/bin/env bash
# Chart CI: `helm lint --strict` and `helm template` over the values matrix, every render
# validated strictly (tests/charts/k8s.py): built-in kinds with kubernetes-validate against
# Kubernetes 1.35, TrainJobs with kubeflow-trainer-api's models, KEDA ScaledObjects and
# TriggerAuthentications with KEDA's own CRD schemas, ServiceMonitors with their schema; an
# object of any other kind fails. Then skaffold.yaml (tests/charts/skaffold.py): valid against
# skaffold's schema for its apiVersion under every profile, and an artifact for every gearshift
# image the chart's values files name.
#
# The matrix: every charts/gearshift/ci/*.yaml, every example values-*.yaml alone, and
# values-gpu.yaml under each other example (tests/charts/k8s.py's scenarios() is the same list).
# A values file whose first line is `# api-versions: trainer.kubeflow.org/v1alpha1` (or
# keda.sh/v1alpha1/ScaledObject; comma-separated) is rendered for a cluster serving those CRDs
# (helm template --api-versions; helm lint takes none, and lints a template's `fail` as a
# message, not an error).
# Installs helm into .tools/bin first when it is missing (scripts/install-k8s-tools.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHART="$ROOT/charts/gearshift"
KUBE_VERSION="${KUBE_VERSION:-1.35.0}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"

"$ROOT/scripts/install-k8s-tools.sh" >/dev/null
HELM="$ROOT/.tools/bin/helm"

scenarios=()
for file in "$CHART"/ci/*.yaml; do
    scenarios+=("ci/$(basename "$file")")
done
for file in "$CHART"/values-*.yaml; do
    name="$(basename "$file")"
    scenarios+=("$name")
    [[ "$name" == values-gpu.yaml ]] || scenarios+=("values-gpu.yaml $name")
done

failed=0
for scenario in "${scenarios[@]}"; do
    args=()
    apis=()
    for file in $scenario; do
        args+=(-f "$CHART/$file")
        for version in $(sed -n '1s/^# api-versions://p' "$CHART/$file" | tr ',' ' '); do
            apis+=(--api-versions "$version")
        done
    done
    if ! lint="$("$HELM" lint --strict "$CHART" "${args[@]}" 2>&1)"; then
        echo "FAIL lint     [$scenario]"; echo "$lint"; failed=$((failed + 1)); continue
    fi
    if ! rendered="$("$HELM" template gearshift "$CHART" --namespace gearshift --kube-version "$KUBE_VERSION" "${apis[@]}" "${args[@]}" 2>&1)"; then
        echo "FAIL template [$scenario]"; echo "$rendered"; failed=$((failed + 1)); continue
    fi
    if ! report="$(printf '%s\n' "$rendered" | (cd "$ROOT" && "$PYTHON" -m tests.charts.k8s) 2>&1)"; then
        echo "FAIL validate [$scenario]"; echo "$report"; failed=$((failed + 1)); continue
    fi
    echo "ok   [$scenario] $(printf '%s\n' "$rendered" | grep -c '^kind:') objects"
done

if ! report="$(cd "$ROOT" && "$PYTHON" -m tests.charts.skaffold 2>&1)"; then
    echo "FAIL skaffold"; echo "$report"; failed=$((failed + 1))
else
    echo "ok   [skaffold] $report"
fi

if [[ $failed -ne 0 ]]; then
    echo "chart checks FAILED: $failed of ${#scenarios[@]} scenarios and skaffold.yaml"
    exit 1
fi
echo "chart matrix OK (${#scenarios[@]} scenarios, helm lint --strict + strict validation: kubernetes-validate -k $KUBE_VERSION, kubeflow-trainer-api, KEDA CRD schemas; skaffold.yaml against its schema)"
