#!/usr/bin/env bash
# Starts the services the tests need, runs pytest, stops the services. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh
ROOTFS_PID=
stop_all() {
  if [ -n "$ROOTFS_PID" ]; then kill -- "-$ROOTFS_PID" 2>/dev/null || true; fi  # with its debootstrap
  stop_services
}
trap stop_all EXIT
start_postgres
start_redis
if [ $# -eq 0 ]; then
  # The whole suite: the runner image's Debian rootfs (debootstrap, 1-3 min of downloads and unpacking on a fresh
  # clone, cached after) is made beside the first tests, which do not need it; the first Docker test waits for it.
  CODEYARD_CACHE_DIR=${CODEYARD_CACHE_DIR:-$PWD/.codeyard/cache} setsid .venv/bin/codeyard sandbox rootfs \
    > "$SERVICES_DIR/rootfs.log" 2>&1 &
  ROOTFS_PID=$!
fi
set +e
.venv/bin/python -m pytest -p no:cacheprovider --durations=30 "$@"
rc=$?
set -e
exit $rc
