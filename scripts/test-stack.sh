#!/usr/bin/env bash
# make test-stack: a dockerd of our own (unless DOCKER_HOST answers), the images built without a registry,
# then the stack tests (tests/stack). Takes 15-40 minutes the first time (debootstrap, wheels, images);
# STACK_BUILD=0 reuses the images already built. A dockerd this script started is stopped at the end.
# Compose v1 (`docker-compose`, Debian bookworm's) runs the stack; CODEYARD_COMPOSE="docker compose" for v2.
set -euo pipefail
cd "$(dirname "$0")/.."
state=$PWD/.services/docker-stack
stop_engine() {  # the dockerd started below (setsid execs it in place: $! is its pid), and wait for it to go
  kill "$engine" 2>/dev/null || return 0
  for _ in $(seq 60); do kill -0 "$engine" 2>/dev/null || return 0; sleep 1; done
  echo "dockerd ($engine) still running after 60 s" >&2
}
if ! docker info >/dev/null 2>&1; then
  mkdir -p "$state"
  export DOCKER_HOST="unix://$state/docker.sock"
  if ! docker info >/dev/null 2>&1; then
    setsid dockerd --data-root "$state/data" --exec-root "$state/exec" --pidfile "$state/dockerd.pid" \
      --host "$DOCKER_HOST" --bridge none >"$state/dockerd.log" 2>&1 &
    engine=$!
    trap stop_engine EXIT
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  fi
fi
[ "${STACK_BUILD:-1}" = 0 ] || nice -n 19 .venv/bin/codeyard images build
CODEYARD_STACK_TEST=1 .venv/bin/python -m pytest -p no:cacheprovider -v tests/stack "$@"
