#!/usr/bin/env bash
# The training figures of a GPU, in one call of under 10 minutes on a lent machine (the device
# tool; benchmarks/gpu_training.py says what is measured). That machine has CUDA torch,
# transformers, peft, accelerate, pandas and pyarrow but no network: what else gearshift and TRL
# need travels from here as wheels, with the SmolLM2 tokenizer, in .gpu/ (git ignores it).
#
#   scripts/gpu-check.sh prepare          # here: fill .gpu/ (about 15 MB)
#   scripts/gpu-check.sh run              # there, carrying .gpu: install into /tmp/site, run, write $OUT
# The same code paths here, on the CPU, in a minute:
#   .venv/bin/python benchmarks/gpu_training.py --shape tiny --load-shape tiny --moe-shape tiny --device cpu --tokenizer .gpu/tokenizer --out /tmp/gpu-check
set -euo pipefail
cd "$(dirname "$0")/.."
GPU=.gpu
PYTHON_VERSION=${PYTHON_VERSION:-3.12}  # the lent machine's (its KINDS.md entry)
# What the lent machine lacks, at the versions this checkout's .venv holds (grpcio and protobuf:
# the generated code checks their versions).
PACKAGES=(pydantic pydantic-core pydantic-settings python-dotenv annotated-types typing-inspection
          grpcio protobuf datasets dill multiprocess trl math-verify latex2sympy2_extended antlr4-python3-runtime)

prepare() {
  local venv=.venv/bin/python pins=()
  for package in "${PACKAGES[@]}"; do
    pins+=("$package==$($venv -c "import importlib.metadata as m; print(m.version('$package'))")")
  done
  rm -rf "$GPU" && mkdir -p "$GPU/wheels"
  $venv -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$GPU/wheels" "${pins[@]}"
  $venv -c "from gearshift import weights; from gearshift.settings import Settings; \
weights.smollm2_tokenizer(Settings().models_dir).save_pretrained('$GPU/tokenizer')"
  du -sh "$GPU"
}

run() {
  local site=/tmp/site out=${OUT:-gpu-check-out}
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$GPU"/wheels/*.whl
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade --target "$site" .
  mkdir -p "$out"
  PYTHONPATH="$site" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 python3 benchmarks/gpu_training.py \
    --tokenizer "$GPU/tokenizer" --out "$out" "$@" 2>&1 | tee "$out/log.txt"
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  *) echo "usage: scripts/gpu-check.sh prepare | run [benchmarks/gpu_training.py options]" >&2; exit 2 ;;
esac
