# Stand-ins for the official postgres and redis images the chart's bundled StatefulSets name, for
# `make test-images` on machines that reach apt but no image registry: Debian's PostgreSQL 15 and
# Redis 7 on the same base as the gearshift images. They keep the contracts the chart relies on:
# uid 999, POSTGRES_DB/USER/PASSWORD and PGDATA on first start, pg_isready, redis-server and
# redis-cli on the PATH, data under /var/lib/postgresql/data and /data.
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm
FROM ${PYTHON_IMAGE}
# uid/gid 999 first, so the packages adopt them (the official images run as 999).
RUN groupadd --system --gid 999 postgres && useradd --system --uid 999 --gid 999 --home-dir /var/lib/postgresql postgres \
    && apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql-15 redis-server \
    && rm -rf /var/lib/apt/lists/* /var/lib/postgresql/15 /etc/postgresql \
    && install -d -o 999 -g 999 /var/lib/postgresql/data /var/run/postgresql /data
ENV PATH=/usr/lib/postgresql/15/bin:$PATH
COPY docker/testing/postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
USER 999:999
CMD ["postgres-entrypoint.sh"]
