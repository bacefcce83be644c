#!/usr/bin/env bash
# Starts the services the tests need, runs pytest, stops the services. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh
trap stop_services EXIT
start_postgres
start_redis
set +e
.venv/bin/python -m pytest -p no:cacheprovider --durations=30 "$@"
rc=$?
set -e
exit $rc
