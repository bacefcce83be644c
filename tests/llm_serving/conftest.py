"""A tiny random Llama with SmolLM2's real tokenizer (chat template included), and a real server.

The tiny model makes most cases fast; its tokenizer is the one the built-in model ships, read from
its GGUF file, so prompts, chat templates and usage counts behave as with the real model.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import uvicorn
from transformers import AutoModelForCausalLM, LlamaConfig

from llm_engine.config import EngineConfig
from llm_engine.entrypoints.app import create_app
from llm_engine.entrypoints.ensemble import Ensemble
from llm_engine.entrypoints.models import builtin_model_path
from llm_engine.entrypoints.service import ServerOptions
from llm_engine.loader.gguf_conversion import config_and_tokenizer

# Served tensor parallelism starts worker groups: it runs under `make test-llm-parallel`.
collect_ignore = [] if os.environ.get("CODEYARD_TP_MORE") == "1" else ["test_cli_tensor_parallel.py"]

TINY_NAME = "tiny-chat"
ENSEMBLE_CONFIG = Path(__file__).resolve().parents[2] / "llm_engine/entrypoints/code_completion_ensemble.json"


@pytest.fixture(scope="session")
def smollm_tokenizer():
    return config_and_tokenizer(builtin_model_path())[1]


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory, smollm_tokenizer) -> Path:
    folder = tmp_path_factory.mktemp(TINY_NAME)
    config = LlamaConfig(vocab_size=len(smollm_tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, initializer_range=0.2, tie_word_embeddings=True,
                         bos_token_id=smollm_tokenizer.bos_token_id, eos_token_id=smollm_tokenizer.eos_token_id)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(7)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    smollm_tokenizer.save_pretrained(folder)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningServer:
    url: str
    app: object
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def service(self):
        return self.app.state.llm

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def start_server(app, ready_timeout: float = 300) -> RunningServer:
    """uvicorn in a thread on a free port; returns once it accepts connections."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + ready_timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("server did not start")
        time.sleep(0.05)
    return RunningServer(f"http://127.0.0.1:{port}", app, server, thread)


def unfinished_requests(running: RunningServer) -> int:
    """Requests running or waiting in the server's engine, from its latest stats (either engine kind)."""
    stats = running.service.engine.stats()
    return stats.num_running + stats.num_waiting if stats is not None else 0


def serve_model(model: Path | str, name: str, options: ServerOptions | None = None,
                **engine_kwargs) -> RunningServer:
    config = EngineConfig(model=str(model), **engine_kwargs)
    running = start_server(create_app(config, name, options))
    running.service.engine.wait_ready(600)
    return running


@pytest.fixture(scope="session")
def tiny_server(tiny_chat_model) -> Iterator[RunningServer]:
    options = ServerOptions(max_waiting=8, grpc_address=f"127.0.0.1:{free_port()}",
                            ensembles=(Ensemble.load(ENSEMBLE_CONFIG),),
                            engine_process=True)  # as `llm serve` runs it: the engine core in its own process
    # float32 like the offline engines the tests compare with: "auto" is bfloat16 on a CPU with fast
    # bf16 (AVX512-BF16), and a beam search's ranking differed from float32's there.
    running = serve_model(tiny_chat_model, TINY_NAME, options, max_num_seqs=8,
                          num_kv_blocks=64, max_model_len=512, dtype="float32")
    yield running
    running.stop()


@pytest.fixture
def client(tiny_server):
    from openai import OpenAI

    return OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
