#!/usr/bin/env bash
# Generates the browser's API types (web/src/api/schema.d.ts, or the file named by $1) from the app's
# OpenAPI document with openapi-typescript (pinned in web/package.json; `make web` installs it).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(realpath -m "${1:-$root/web/src/api/schema.d.ts}")"
generator="$root/web/node_modules/.bin/openapi-typescript"
if [ ! -x "$generator" ]; then
  echo "openapi-typescript is not installed: run make web first" >&2
  exit 2
fi
document="$(mktemp --suffix=.json)"
trap 'rm -f "$document"' EXIT
(cd "$root" && PYTHONPATH="$root" "$root/.venv/bin/python" scripts/openapi_document.py >"$document")
"$generator" "$document" --output "$out" --alphabetize >/dev/null
