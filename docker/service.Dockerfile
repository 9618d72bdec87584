# Images without torch: the six gRPC services and the HTTP gateway (target `service`, one image per
# SERVICE) and the Celery worker that orchestrates training (target `worker`). Build from the repository root so
# libs/ and the generated protos are in the context:
#   docker build -f docker/service.Dockerfile --target service --build-arg SERVICE=router -t gearshift-router .
#   docker build -f docker/service.Dockerfile --target worker -t gearshift-worker .
# The services share one dependency set, so one Dockerfile builds all of them: seven copies
# would only drift apart. skaffold.yaml builds each image as its own artifact; `make images`
# builds them all (docs/images.md).
# PYTHON_IMAGE: the pinned slim image, or where no registry is reachable the same Python built
# from Debian packages (scripts/build-base-image.sh). EXTRA_CA_CERTS: PEM text of CA certificates
# that package downloads need (behind a TLS-intercepting proxy); only the builder stage sees it.
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ARG EXTRA_CA_CERTS=""
RUN if [ -n "${EXTRA_CA_CERTS}" ]; then \
      printf '%s\n' "${EXTRA_CA_CERTS}" > /usr/local/share/ca-certificates/extra.crt && update-ca-certificates >/dev/null; fi
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependency layer first: rebuilt only when pyproject.toml changes, not on every source edit.
COPY pyproject.toml docker/requirements.py ./
RUN python requirements.py > requirements.txt && pip install -r requirements.txt
COPY setup.py ./
COPY libs libs
COPY services services
COPY training-jobs training-jobs
RUN pip install --no-deps . && python -m compileall -q /opt/venv

FROM ${PYTHON_IMAGE} AS runtime
# Bytecode is compiled at build time; the root filesystem is read-only in the pod.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    GEARSHIFT_HOST=0.0.0.0 \
    GEARSHIFT_PORT=50051 \
    GEARSHIFT_METRICS_PORT=9090 \
    GEARSHIFT_DATA_DIR=/var/lib/gearshift
RUN groupadd --system --gid 10001 gearshift \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gearshift \
    && install -d -o 10001 -g 10001 /var/lib/gearshift
COPY --from=builder /opt/venv /opt/venv
WORKDIR /var/lib/gearshift
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001

FROM runtime AS worker
ENTRYPOINT ["celery", "-A", "gearshift.orchestration.app", "worker", "--queues", "default,training", "--loglevel", "INFO"]

FROM runtime AS service
ARG SERVICE
RUN test -n "${SERVICE}" || { echo "build with --build-arg SERVICE=<router|planner|executor|sandbox|reward|store|gateway>" >&2; exit 1; }
ENV GEARSHIFT_SERVICE=${SERVICE}
# gRPC services: 50051 and metrics on 9090; the gateway: HTTP on GEARSHIFT_PORT (the chart: 8100).
EXPOSE 50051 9090
# The pod probes the standard grpc.health.v1 service natively (the gateway: its /health and
# /ready); exec keeps the service PID 1 so it receives SIGTERM and drains.
ENTRYPOINT ["/bin/sh", "-c", "exec gearshift serve \"$GEARSHIFT_SERVICE\""]
