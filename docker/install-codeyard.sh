#!/bin/sh
# install-codeyard.sh EXTRAS [NO_DEPS...]: /opt/venv with codeyard[EXTRAS] from /opt/codeyard (and NO_DEPS
# without their dependencies), from the wheels in /tmp/pip where the build brought them (PIP_NO_INDEX=1: only
# from those), else from the package index.
set -eu
python3 -m venv /opt/venv
index=""
[ "${PIP_NO_INDEX:-0}" = 1 ] && index="--no-index"
# The package's own wheel where the build brought one (it holds the built web assets), else its sources.
target="/opt/codeyard$1"
ls /tmp/pip/codeyard-*.whl >/dev/null 2>&1 && target="codeyard$1"
/opt/venv/bin/pip install -q $index --find-links /tmp/pip -c /tmp/pip/constraints.txt "$target"
shift
[ $# -eq 0 ] || /opt/venv/bin/pip install -q $index --find-links /tmp/pip --no-deps "$@"
rm -rf /tmp/pip /root/.cache /opt/codeyard/build
