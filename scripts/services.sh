#!/usr/bin/env bash
# Starts throwaway PostgreSQL and Redis servers for the test suite under .services/ and
# prints the environment variables that point the tests at them. Usage: source scripts/services.sh
set -euo pipefail
SERVICES_DIR=${SERVICES_DIR:-$PWD/.services}
PG_PORT=${PG_PORT:-55432}
REDIS_PORT=${REDIS_PORT:-56379}
mkdir -p "$SERVICES_DIR"

pg_bin() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$d" ] && echo "$d" || dirname "$(command -v pg_ctl)"
}

start_postgres() {
  local bin data run as=()
  bin=$(pg_bin)
  data=$SERVICES_DIR/pg
  run=$SERVICES_DIR/pg-run
  if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    as=(runuser -u postgres --)
  fi
  if [ ! -f "$data/PG_VERSION" ]; then
    mkdir -p "$data"
    [ ${#as[@]} -gt 0 ] && chown postgres "$data"
    "${as[@]}" "$bin/initdb" -D "$data" -U codeyard --auth=trust -E UTF8 >/dev/null
  fi
  mkdir -p "$run"
  [ ${#as[@]} -gt 0 ] && chown postgres "$run" "$SERVICES_DIR"
  if ! "${as[@]}" "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    STARTED_POSTGRES=1
    "${as[@]}" "$bin/pg_ctl" -D "$data" -l "$SERVICES_DIR/pg.log" -w \
      -o "-p $PG_PORT -k $run -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >/dev/null
  fi
  "$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U codeyard -d postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname='codeyard_test'" | grep -q 1 ||
    "$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U codeyard -d postgres -qc "CREATE DATABASE codeyard_test" >/dev/null
  export CODEYARD_TEST_POSTGRES_URL="postgresql+psycopg://codeyard@127.0.0.1:$PG_PORT/codeyard_test"
}

start_redis() {
  if ! redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
    STARTED_REDIS=1
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
      --logfile "$SERVICES_DIR/redis.log" --dir "$SERVICES_DIR" >/dev/null
    for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  export CODEYARD_TEST_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
}

# Stops only the servers this shell started, so concurrent test runs don't pull them from each other.
stop_services() {
  local bin as=()
  bin=$(pg_bin)
  [ "$(id -u)" -eq 0 ] && as=(runuser -u postgres --)
  if [ -n "${STARTED_POSTGRES:-}" ]; then
    "${as[@]}" "$bin/pg_ctl" -D "$SERVICES_DIR/pg" -m fast stop >/dev/null 2>&1 || true
  fi
  if [ -n "${STARTED_REDIS:-}" ]; then
    redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
  fi
}
