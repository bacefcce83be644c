"""Built engines (`codeyard llm build`): an ENGINE_DIR gives its checkpoint's greedy tokens without
capturing again, and bad input is a clear error (CLI exit 2). One tiny one-layer Gemma 2 is built
once for the module (window, soft-capping, tied embeddings: the pickled graph's hardest parts; one
layer, as torch.export's time grows with the layers)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import torch
from autodeploy_models import build, hf_greedy, prompts, run_cli
from serve_process import free_port
from tiny_llm import save_tiny_chat_llama
from waiting import wait_until

from llm_engine import LLM, SamplingParams
from llm_engine.autodeploy import model as autodeploy_model
from llm_engine.autodeploy.model import AutoDeployedCausalLM
from llm_engine.loader.engine_manifest import MANIFEST, EngineManifest

FULL = os.environ.get("CODEYARD_AUTODEPLOY_FULL") == "1"

MAX_NEW = 10
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(checkpoint folder, engine folder, the build command's output)."""
    root = tmp_path_factory.mktemp("engine")
    checkpoint = build("gemma2", root / "gemma2", num_hidden_layers=1)
    capture = pytest.MonkeyPatch()
    lines: list[str] = []
    capture.setattr("typer.echo", lambda message="", **_: lines.append(str(message)))
    try:
        code = run_cli("build", str(checkpoint), "--out", str(root / "engine"))
    finally:
        capture.undo()
    assert code == 0, lines
    return checkpoint, root / "engine", lines


def test_build_reports_progress_passes_and_sizes(built):
    _, engine, lines = built
    text = "\n".join(lines)
    assert "[1/5]" in text and "[5/5]" in text
    assert "replace_attention: 1 layers -> paged attention (1 window+softcap" in text
    assert "merge_sibling_linears" in text and "built in" in text and "MB -> engine" in text
    manifest = json.loads((engine / MANIFEST).read_text())
    assert (manifest["dtype"], manifest["target"]) == ("float32", "cpu")


def test_engine_gives_the_checkpoints_greedy_tokens_without_capturing(built, monkeypatch):
    checkpoint, engine, _ = built
    monkeypatch.setattr(autodeploy_model, "capture", lambda *a: pytest.fail("an engine must load without export"))
    batch = prompts()
    llm = LLM(str(engine), block_size=4, num_kv_blocks=12)
    assert isinstance(llm.engine.model_runner.model, AutoDeployedCausalLM)
    outputs = llm.generate(batch, GREEDY, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == hf_greedy(checkpoint, batch, MAX_NEW)
    assert sum(o.metrics.num_preemptions for o in outputs) > 0
    assert sum(o.metrics.num_cached_tokens for o in outputs) >= 12


def test_an_engine_from_another_version_is_refused_with_the_reason(built, tmp_path):
    _, engine, _ = built
    other = shutil.copytree(engine, tmp_path / "other")
    manifest = json.loads((other / MANIFEST).read_text())
    manifest["versions"]["torch"] = "1.0.0"
    (other / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"built with torch 1\.0\.0 \(here .*\); rebuild it"):
        LLM(str(other))
    assert run_cli("serve", "--model", str(other)) == 2
    with pytest.raises(ValueError, match="dtype: the engine was built in torch.float32"):
        LLM(str(engine), dtype="bfloat16")


def test_bad_build_input_exits_2(built, tmp_path, capsys):
    checkpoint, engine, _ = built
    (tmp_path / "empty").mkdir()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    (tmp_path / "file").write_text("")
    cases = {"no config.json": (tmp_path / "empty", tmp_path / "out1"),
             "already a built engine": (engine, tmp_path / "out2"),
             "is not an engine folder": (checkpoint, tmp_path / "busy"),
             "cannot write to": (checkpoint, tmp_path / "file" / "sub")}
    for message, (src, out) in cases.items():
        assert run_cli("build", str(src), "--out", str(out)) == 2, message
        assert message in capsys.readouterr().err
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


def test_target_is_checked_at_build_and_at_load(built, tmp_path, capsys):
    checkpoint, engine, _ = built
    assert run_cli("build", str(checkpoint), "--out", str(tmp_path / "tpu"), "--target", "tpu") == 2
    assert "--target: must be one of cpu, cuda, got 'tpu'" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert run_cli("build", str(checkpoint), "--out", str(tmp_path / "gpu"), "--target", "cuda") == 2
        assert "--target cuda: this machine has no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "tpu").exists() and not (tmp_path / "gpu").exists()  # refused before anything is written
    for_gpu = shutil.copytree(engine, tmp_path / "for_gpu")
    manifest = json.loads((for_gpu / MANIFEST).read_text())
    manifest["target"] = "cuda"
    (for_gpu / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"device: the engine was built for cuda .* cannot run on cpu"):
        LLM(str(for_gpu))


def test_an_engine_runs_with_its_measured_options_unless_given_others(built, tmp_path, monkeypatch):
    """`llm tune` records runtime options; LLM(ENGINE_DIR) and `llm serve` use them, a
    caller's own win, and threads chosen on a machine with another CPU count are not applied."""
    _, engine, _ = built
    tuned = shutil.copytree(engine, tmp_path / "tuned")
    manifest = json.loads((tuned / MANIFEST).read_text())
    options = {"attention_backend": "torch", "num_threads": 1, "block_size": 8, "max_num_batched_tokens": 64}
    threads = torch.get_num_threads()

    def config_with(runtime_cpus: int | None, **given):
        manifest["runtime"] = {"options": options, "cpus": runtime_cpus}
        (tuned / MANIFEST).write_text(json.dumps(manifest))
        return LLM(str(tuned), num_kv_blocks=16, **given).engine.config

    try:
        config = config_with(os.cpu_count())
        assert {name: getattr(config, name) for name in options} == options
        config = config_with(os.cpu_count(), block_size=4, attention_backend="native")
        assert (config.block_size, config.attention_backend, config.max_num_batched_tokens) == (4, "native", 64)
        assert config_with(os.cpu_count() + 1).num_threads is None
        served = []
        monkeypatch.setattr("llm_engine.entrypoints.app.create_app", lambda config, *_: served.append(config))
        monkeypatch.setattr("uvicorn.run", lambda *_, **__: None)
        assert run_cli("serve", "--model", str(tuned), "--num-threads", "2") == 0
        assert (served[0].block_size, served[0].max_num_batched_tokens, served[0].num_threads) == (8, 64, 2)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.skipif(not FULL, reason="make test-autodeploy")
@pytest.mark.parametrize("model_type", ["gemma2", "olmo2", "phi", "phi3"])
def test_an_engine_saved_for_one_rank_runs_at_tensor_parallel_size_2(built, tmp_path, model_type):
    """Each worker shards the loaded graphs and takes its share of the saved tensors: Gemma 2's
    tied table, windowed and soft-capped attention (the module's engine), OLMo 2's gathered q/k
    norms, Phi's LM head bias, Phi-3's q/k/v and gate/up matrices made again per part."""
    checkpoint, engine = built[:2]
    if model_type != "gemma2":
        checkpoint, engine = build(model_type, tmp_path / model_type), tmp_path / "engine"
        assert run_cli("build", str(checkpoint), "--out", str(engine)) == 0
    batch = prompts()
    llm = LLM(str(engine), tensor_parallel_size=2, block_size=4, num_kv_blocks=12)
    try:
        outputs = llm.generate(batch, GREEDY, use_tqdm=False)
        assert [list(o.outputs[0].token_ids) for o in outputs] == hf_greedy(checkpoint, batch, MAX_NEW)
        assert sum(o.metrics.num_preemptions for o in outputs) > 0
    finally:
        llm.engine.shutdown()


def quantized_engine(checkpoint, folder, quantization: str | dict) -> str:
    """`llm build --quantization` of `checkpoint` (a method, or a config written to a JSON file)."""
    if isinstance(quantization, dict):
        (folder / "quantization.json").write_text(json.dumps(quantization))
        quantization = str(folder / "quantization.json")
    assert run_cli("build", str(checkpoint), "--out", str(folder / "engine"), "--quantization", quantization) == 0
    layers = EngineManifest.read(folder / "engine").quantization
    assert sum(scheme != "float" for scheme in layers.values()) >= 4, layers
    return str(folder / "engine")


@pytest.mark.skipif(not FULL, reason="make test-autodeploy")
@pytest.mark.parametrize(("model_type", "quantization"), [
    ("gemma2", "int8"),  # per output channel: each rank keeps a row-parallel layer's scales whole
    ("gemma2", "int4"),  # g128 over 64 and 128 inputs: one group a row, its codes packed again per rank
    ("phi3", {"method": "int4", "group_size": 32}),  # whole groups a rank; q/k/v and gate/up matrices cut per part
], ids=["gemma2-int8", "gemma2-int4-g128", "phi3-int4-g32"])
def test_a_quantized_engine_gives_its_one_rank_tokens_at_tensor_parallel_size_2(built, tmp_path, model_type,
                                                                                 quantization):
    """The same built engine at one and two ranks: each rank takes its share of the packed codes,
    scales and zero points, so greedy tokens match under preemption."""
    checkpoint = built[0] if model_type == "gemma2" else build(model_type, tmp_path / model_type)
    engine = quantized_engine(checkpoint, tmp_path, quantization)
    batch = prompts()
    one_rank = LLM(engine, block_size=4, num_kv_blocks=12).generate(batch, GREEDY, use_tqdm=False)
    llm = LLM(engine, tensor_parallel_size=2, block_size=4, num_kv_blocks=12)
    try:
        outputs = llm.generate(batch, GREEDY, use_tqdm=False)
        assert [list(o.outputs[0].token_ids) for o in outputs] == [list(o.outputs[0].token_ids) for o in one_rank]
        assert sum(o.metrics.num_preemptions for o in outputs) > 0
    finally:
        llm.engine.shutdown()


@pytest.mark.skipif(not FULL, reason="make test-autodeploy")
def test_a_quantization_group_across_two_ranks_is_refused_naming_the_layer(tmp_path):
    checkpoint = build("gemma2", tmp_path / "gemma2", num_hidden_layers=1, intermediate_size=192)
    engine = quantized_engine(checkpoint, tmp_path, "int4")  # g128: down_proj's 192 inputs are 96 a rank
    with pytest.raises(ValueError, match=r"mlp.down_proj is quantized int4 g128 asym: its 192 inputs across 2 ranks "
                                         r"are 96 each, not whole groups of 128"):
        LLM(engine, tensor_parallel_size=2, block_size=4, num_kv_blocks=12)


def answers_health(proc: subprocess.Popen[str], port: int) -> bool:
    assert proc.poll() is None, proc.communicate()[0]
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.skipif(not FULL, reason="make test-autodeploy")
def test_llm_serve_answers_the_openai_client_from_a_built_engine(tmp_path):
    """`codeyard llm serve --model ENGINE_DIR` as users run it (a process on a port, the official
    client) gives the engine's own greedy text."""
    engine = tmp_path / "engine"
    assert run_cli("build", str(save_tiny_chat_llama(tmp_path / "chat")), "--out", str(engine)) == 0
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    expected = LLM(str(engine), num_kv_blocks=16).generate(["def add(a, b):"], params, use_tqdm=False)[0]
    port = free_port()
    codeyard = str(Path(sys.executable).parent / "codeyard")
    proc = subprocess.Popen([codeyard, "llm", "serve", "--model", str(engine), "--port", str(port),
                             "--served-model-name", "built", "--max-num-seqs", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: answers_health(proc, port), timeout=180, pause=0.5, what="the served engine's /health")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        out = client.completions.create(model="built", prompt="def add(a, b):", max_tokens=8, temperature=0,
                                        extra_body={"ignore_eos": True})
        assert out.choices[0].text == expected.outputs[0].text
        assert out.usage.completion_tokens == 8
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
