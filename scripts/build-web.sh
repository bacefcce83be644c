#!/usr/bin/env bash
# Builds the browser assets into ide_server/webassets (hashed names) when the sources changed.
set -euo pipefail
cd "$(dirname "$0")/../web"
# One build at a time: Vite empties the output folder, which would break a concurrent build or page load.
exec 9>"${TMPDIR:-/tmp}/codeyard-web-build.lock"
flock 9
stamp=../ide_server/webassets/.source-hash
hash=$(find src package.json package-lock.json vite.config.ts tsconfig.json -type f | sort | xargs sha256sum | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ]; then
  echo "web assets up to date"
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
npm run build
echo "$hash" > "$stamp"
