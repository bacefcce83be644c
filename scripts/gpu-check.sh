#!/usr/bin/env bash
# Issue 20's checks on a machine with a CUDA GPU and its own python3 (torch with CUDA, Triton,
# transformers, pytest), such as the device machine, which has no network and no .venv:
#   bash scripts/gpu-check.sh [tests|figures|all]      (all: ~10 min at most on one H200)
# tests:   the CUDA engine parity tests and every Triton kernel test, compiled on the GPU (<= 3 min)
# figures: benchmarks/gpu_check.py, every figure of the issue (<= 7 min)
# Logs and gpu_check.json go to $OUT (default ./gpu-check-out). Python packages the machine lacks
# travel as wheels in .whl/ (ignored by git; carry it): the engine's loader imports `gguf`, e.g.
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl gguf==0.19.0
set -o pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-gpu-check-out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 CODEYARD_CACHE_DIR=${CODEYARD_CACHE_DIR:-/tmp/codeyard-cache}
# The engine's C++ CPU kernels are not used on the GPU; building them would cost device time.
export CXX=/bin/false
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee "$OUT/env.log"
status=0
if [[ ${1:-all} != figures ]]; then
    # --confcutdir: the folder's own conftest only (tests/conftest.py needs the IDE's packages)
    timeout 200 "$PY" -m pytest -p no:cacheprovider -q -o addopts="" --confcutdir=tests/llm_engine \
        tests/llm_engine/test_cuda_engine.py tests/llm_engine/test_cuda_graphs.py tests/llm_engine/test_triton_*.py \
        2>&1 | tee "$OUT/tests.log" || status=1
fi
if [[ ${1:-all} != tests ]]; then
    timeout 420 "$PY" benchmarks/gpu_check.py --json "$OUT/gpu_check.json" 2>&1 | tee "$OUT/gpu_check.log" || status=1
fi
exit $status
