#!/usr/bin/env bash
# Installs the Debian packages the tests use (only when run as root; otherwise says what is missing).
set -euo pipefail
# g++: the LLM engine compiles its CPU attention kernel on first use (it falls back to PyTorch without one).
# strace: a sandbox test checks that no descriptor is closed twice.
PKGS=(docker.io docker-compose bubblewrap redis-server postgresql chromium debootstrap g++ strace)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages (install them as root): ${missing[*]}" >&2
  exit 0
fi
echo "installing Debian packages: ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
