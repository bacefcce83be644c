"""`codeyard llm ...`: run the standalone server (OpenAI /v1, KServe v2 /v2 and optionally gRPC), or
quantize a checkpoint."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Serve the LLM engine over an OpenAI-compatible HTTP API, or quantize a checkpoint.",
                  no_args_is_help=True)


@app.callback()
def llm() -> None:
    """Serve the LLM engine over an OpenAI-compatible HTTP API, or quantize a checkpoint."""


def parse_json_option(value: str | None, option: str) -> dict | None:
    if value is None:
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{option}: not valid JSON ({exc})") from None


@app.command()
def serve(
    model: Annotated[str | None, typer.Option(help="Local HF folder or .gguf file (default: $CODEYARD_LLM_MODEL, "
                                                   "else the built-in SmolLM2-135M-Instruct).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8001,
    grpc_port: Annotated[int | None, typer.Option(min=1, max=65535, help="Also serve KServe v2 gRPC "
                                                  "(Triton's GRPCInferenceService) on this port.")] = None,
    ensemble: Annotated[list[Path] | None, typer.Option(help="A Triton ensemble config (JSON) to serve under "
                                                        "/v2 next to the model (repeatable).")] = None,
    served_model_name: Annotated[str | None, typer.Option(help="Model name clients send (default: from the path).")] = None,
    api_key: Annotated[list[str] | None, typer.Option(help="Required Bearer key (repeatable; default: "
                                                          "$CODEYARD_LLM_API_KEY, else no key).")] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda[:N].")] = "cpu",
    max_num_seqs: Annotated[int, typer.Option(min=1)] = 64,
    tensor_parallel_size: Annotated[int, typer.Option(min=1, help="Worker processes the model is split "
                                                       "across (CPU, gloo).")] = 1,
    data_parallel_size: Annotated[int, typer.Option(min=1, help="Replica servers behind one endpoint, "
                                                     "routed by cached prefix.")] = 1,
    max_waiting: Annotated[int, typer.Option(min=0, help="Waiting requests before answering 429.")] = 64,
    kv_cache_memory: Annotated[str, typer.Option(help="KV pool size, e.g. 1GiB.")] = "1GiB",
    request_timeout: Annotated[float, typer.Option(min=0.001, help="Seconds before a request is aborted.")] = 600.0,
    quantization: Annotated[str, typer.Option(help="auto (a GGUF stays quantized), none (float weights), int8, "
                                                   "int4, or a per-layer YAML/JSON config file.")] = "auto",
    speculative_config: Annotated[str | None, typer.Option(help='Speculative decoding as JSON, e.g. '
                                                           '\'{"method": "ngram", "num_speculative_tokens": 5}\' '
                                                           '(prompt lookup; default: none).')] = None,
) -> None:
    """Serve MODEL on HOST:PORT (/v1 and /v2; gRPC on --grpc-port); it loads in the background (503 until ready)."""
    import uvicorn

    from llm_engine.config import EngineConfig
    from llm_engine.entrypoints.app import create_app
    from llm_engine.entrypoints.ensemble import Ensemble
    from llm_engine.entrypoints.models import resolve_model
    from llm_engine.entrypoints.service import ServerOptions

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    path, name = resolve_model(model or os.environ.get("CODEYARD_LLM_MODEL"))
    keys = api_key or [k for k in [os.environ.get("CODEYARD_LLM_API_KEY")] if k]
    if data_parallel_size > 1:
        from llm_engine.entrypoints.replicas import replica_servers
        from llm_engine.entrypoints.router import create_router_app

        serve_args = ["--model", path, "--served-model-name", served_model_name or name, "--device", device,
                      "--max-num-seqs", str(max_num_seqs), "--max-waiting", str(max_waiting),
                      "--kv-cache-memory", kv_cache_memory, "--request-timeout", str(request_timeout),
                      "--quantization", quantization, "--tensor-parallel-size", str(tensor_parallel_size)]
        with replica_servers(serve_args, data_parallel_size) as (urls, replica_key):
            uvicorn.run(create_router_app(urls, frozenset(keys), replica_key), host=host, port=port, log_level="info")
        return
    config = EngineConfig(model=path, device=device, max_num_seqs=max_num_seqs, kv_cache_memory=kv_cache_memory,
                          tensor_parallel_size=tensor_parallel_size,
                          quantization=None if quantization == "none" else quantization,
                          speculative_config=parse_json_option(speculative_config, "--speculative-config"))
    options = ServerOptions(max_waiting=max_waiting, request_timeout=request_timeout, api_keys=frozenset(keys),
                            grpc_address=f"{host}:{grpc_port}" if grpc_port else None,
                            ensembles=tuple(Ensemble.load(p) for p in ensemble or ()))
    uvicorn.run(create_app(config, served_model_name or name, options), host=host, port=port, log_level="info")


@app.command()
def quantize(
    source: Annotated[Path, typer.Argument(help="Local Hugging Face model folder (config.json + safetensors).")],
    out: Annotated[Path, typer.Option(help="Folder to write the quantized checkpoint to (new or empty).")],
    method: Annotated[str, typer.Option(help="int8, int4, gptq, awq or fp8 (layouts: see llm_engine/quantize.py).")],
    group_size: Annotated[int | None, typer.Option(help="Inputs per scale (-1: per output channel; default: "
                                                        "128 for 4 bits, per channel for int8).")] = None,
    calibration: Annotated[list[Path] | None, typer.Option(help="Text file for gptq/awq calibration (repeatable; "
                                                           "default: Python standard library sources).")] = None,
) -> None:
    """Write a quantized copy of SOURCE (one line of progress per layer)."""
    from llm_engine.quantize import quantize_checkpoint

    quant = quantize_checkpoint(source, out, method, group_size, calibration, progress=typer.echo)
    typer.echo(f"wrote {out} ({json.dumps(quant)}); load it with LLM({str(out)!r})")
