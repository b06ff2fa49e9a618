#!/bin/bash
# Initialise PGDATA on first start (UTF8, the POSTGRES_* user, password and database), then run the server as
# the postgres user in the foreground.
set -euo pipefail
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }

mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
if [[ ! -s "$PGDATA/PG_VERSION" ]]; then
  pwfile="$(mktemp)"; printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"; chown postgres "$pwfile"
  as_postgres initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --encoding=UTF8 --locale=C.UTF-8 \
    --auth-local=trust --auth-host=scram-sha-256 -D "$PGDATA"
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  as_postgres pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
  if [[ "$POSTGRES_DB" != postgres ]]; then
    as_postgres psql -v ON_ERROR_STOP=1 --username="$POSTGRES_USER" --dbname=postgres \
      -c "CREATE DATABASE \"$POSTGRES_DB\""
  fi
  as_postgres pg_ctl -D "$PGDATA" -m fast -w stop
fi
if [[ "${1:-}" == postgres ]]; then
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$@" -c listen_addresses='*'
fi
exec "$@"
