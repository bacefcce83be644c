#!/bin/sh
# First start: initdb with the user, password (from POSTGRES_PASSWORD_FILE where given) and database asked for.
set -eu
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then POSTGRES_PASSWORD=$(cat "$POSTGRES_PASSWORD_FILE"); fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  printf '%s' "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE}" > /tmp/pwfile
  initdb -D "$PGDATA" -U "$user" --pwfile=/tmp/pwfile --auth-host=scram-sha-256 --auth-local=trust -E UTF8 >/dev/null
  rm -f /tmp/pwfile
  echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
  pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  [ "$db" = postgres ] || createdb -U "$user" "$db"
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec postgres -D "$PGDATA" -c listen_addresses='*'
