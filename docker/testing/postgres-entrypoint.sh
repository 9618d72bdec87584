#!/bin/sh
# The official postgres image's first-start contract, reduced to what the chart uses: an empty
# PGDATA gets a cluster, POSTGRES_USER with POSTGRES_PASSWORD (scram) and POSTGRES_DB.
set -eu
: "${PGDATA:=/var/lib/postgresql/data/pgdata}" "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
export PGDATA
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-host=scram-sha-256 --auth-local=trust >/dev/null
  rm -f "$pwfile"
  printf "listen_addresses = '*'\n" >> "$PGDATA/postgresql.conf"
  printf 'host all all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
  if [ "$POSTGRES_DB" != postgres ]; then
    pg_ctl -w -o "-c listen_addresses=''" start >/dev/null
    createdb --username="$POSTGRES_USER" "$POSTGRES_DB"
    pg_ctl -w -m fast stop >/dev/null
  fi
fi
exec postgres
