#!/usr/bin/env bash
# Chart CI: `helm lint --strict` and `helm template` over the values matrix, every render
# validated with kubernetes-validate in strict mode against Kubernetes 1.35.
#
# The matrix: every charts/gearshift/ci/*.yaml, every example values-*.yaml alone, and
# values-gpu.yaml under each other example (tests/charts/k8s.py's scenarios() is the same list).
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
    for file in $scenario; do
        args+=(-f "$CHART/$file")
    done
    if ! lint="$("$HELM" lint --strict "$CHART" "${args[@]}" 2>&1)"; then
        echo "FAIL lint     [$scenario]"; echo "$lint"; failed=$((failed + 1)); continue
    fi
    if ! rendered="$("$HELM" template gearshift "$CHART" --namespace gearshift --kube-version "$KUBE_VERSION" "${args[@]}" 2>&1)"; then
        echo "FAIL template [$scenario]"; echo "$rendered"; failed=$((failed + 1)); continue
    fi
    # --no-warn: ServiceMonitor is a CRD without a bundled schema (tests/charts checks it).
    if ! report="$(printf '%s\n' "$rendered" | "$PYTHON" -m kubernetes_validate --strict --quiet --no-warn -k "$KUBE_VERSION" - 2>&1)"; then
        echo "FAIL validate [$scenario]"; echo "$report"; failed=$((failed + 1)); continue
    fi
    echo "ok   [$scenario] $(printf '%s\n' "$rendered" | grep -c '^kind:') objects"
done

if [[ $failed -ne 0 ]]; then
    echo "chart matrix FAILED in $failed of ${#scenarios[@]} scenarios"
    exit 1
fi
echo "chart matrix OK (${#scenarios[@]} scenarios, helm lint --strict + kubernetes-validate --strict -k $KUBE_VERSION)"
