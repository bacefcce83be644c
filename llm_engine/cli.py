"""`codeyard llm ...`: run the standalone server (OpenAI /v1, KServe v2 /v2 and optionally gRPC), or
quantize a checkpoint."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from llm_engine.engine_cli import build, tune

app = typer.Typer(help="Serve the LLM engine over an OpenAI-compatible HTTP API, or quantize a checkpoint.",
                  no_args_is_help=True)


@app.callback()
def llm() -> None:
    """Serve the LLM engine over an OpenAI-compatible HTTP API, or quantize a checkpoint."""


def parse_json_option(value: str | None, option: str) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{option}: not valid JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{option}: expected a JSON object, got {type(parsed).__name__}")
    return parsed


def parse_cpus(text: str) -> frozenset[int]:
    """"0", "0,2" or "0-3": CPUs of this machine (ValueError otherwise)."""
    try:
        cpus = frozenset(c for part in text.split(",")
                         for c in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1))
    except ValueError:
        raise ValueError(f"a CPU list such as 0 or 0,1 or 0-3, got {text!r}") from None
    count = os.cpu_count() or 1
    if not cpus or not all(0 <= c < count for c in cpus):
        raise ValueError(f"CPUs {sorted(cpus)} are not all on this machine (0-{count - 1})")
    return cpus


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
    max_num_batched_tokens: Annotated[int | None, typer.Option(min=1, help="Tokens a step at most: the chunked "
                                                               "prefill budget (default 2048).")] = None,
    tensor_parallel_size: Annotated[int, typer.Option(min=1, help="Worker processes the model is split "
                                                       "across (CPU, gloo).")] = 1,
    distributed_executor: Annotated[str, typer.Option(help="Where the tensor-parallel ranks, data-parallel "
                                                      "replicas and disaggregated instances run: mp (local "
                                                      "processes) or ray (a Ray cluster at $RAY_ADDRESS).")] = "mp",
    ray_placement_strategy: Annotated[str, typer.Option(help="ray: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD "
                                                        "(a rank, replica or instance per node).")] = "PACK",
    data_parallel_size: Annotated[int, typer.Option(min=1, help="Replica servers behind one endpoint, "
                                                     "routed by cached prefix.")] = 1,
    max_waiting: Annotated[int, typer.Option(min=0, help="Waiting requests before answering 429.")] = 64,
    scheduling_policy: Annotated[str, typer.Option(help="fcfs, or priority (by each request's `priority`, lower "
                                                   "first); a --disaggregated prefill instance takes priority, "
                                                   "set by the proxy to the prompt's length.")] = "fcfs",
    kv_cache_memory: Annotated[str, typer.Option(help="KV pool size, e.g. 1GiB.")] = "1GiB",
    gpu_memory_utilization: Annotated[float, typer.Option(min=0.01, max=1.0, help="CUDA: the fraction of the GPU's "
                                                          "memory the engine may use; the KV pool gets what its "
                                                          "weights and activations leave.")] = 0.9,
    enforce_eager: Annotated[bool, typer.Option(help="CUDA: decode steps without CUDA graphs.")] = False,
    model_impl: Annotated[str, typer.Option(help="native (the hand-written model where the architecture has one, "
                                              "AutoDeploy for any other Transformers causal LM) or auto "
                                              "(AutoDeploy for every model).")] = "native",
    request_timeout: Annotated[float, typer.Option(min=0.001, help="Seconds before a request is aborted.")] = 600.0,
    quantization: Annotated[str, typer.Option(help="auto (a GGUF stays quantized), none (float weights), int8, "
                                                   "int4, or a per-layer YAML/JSON config file.")] = "auto",
    speculative_config: Annotated[str | None, typer.Option(help='Speculative decoding as JSON, e.g. '
                                                           '\'{"method": "ngram", "num_speculative_tokens": 5}\' '
                                                           '(prompt lookup; default: none).')] = None,
    num_threads: Annotated[int | None, typer.Option(min=1, help="torch threads (default: one per core); "
                                                    "with --distributed-executor ray, each replica's or "
                                                    "instance's CPUs on the cluster (default 1).")] = None,
    engine_cpus: Annotated[str | None, typer.Option(help="Pin the engine's process or thread (and torch's "
                                                    "threads, one per CPU unless --num-threads) to these "
                                                    "CPUs, e.g. 0 or 0-3; the HTTP and gRPC threads are "
                                                    "not pinned.")] = None,
    engine_process: Annotated[bool, typer.Option("--engine-process/--engine-thread",
                                                 help="Step the engine in its own process (its own GIL, "
                                                      "the default) or in a thread of the server's.")] = True,
    disaggregated: Annotated[bool, typer.Option(help="Serve a prefill and a decode instance (a core each) "
                                                     "behind a proxy on this port.")] = False,
    role: Annotated[str | None, typer.Option(help="prefill or decode: one side of disaggregated serving "
                                                  "(behind the --disaggregated proxy).")] = None,
    kv_host: Annotated[str, typer.Option(help="prefill: address its KV port listens on; decode: the "
                                              "prefill instance's host.")] = "127.0.0.1",
    kv_port: Annotated[int | None, typer.Option(min=1, max=65535, help="prefill: port its KV is pulled from; "
                                                "decode: the prefill instance's KV port.")] = None,
    kv_transport: Annotated[str, typer.Option(help="decode: shm (same host) or socket (between hosts).")] = "shm",
    max_local_prefill_length: Annotated[int, typer.Option(min=0, help="--disaggregated: prompts of at most this "
                                                           "many tokens are prefilled on the decode instance "
                                                           "itself (0: none).")] = 0,
) -> None:
    """Serve MODEL on HOST:PORT (/v1 and /v2; gRPC on --grpc-port); it loads in the background (503 until ready)."""
    import uvicorn

    from llm_engine.config import EngineConfig
    from llm_engine.entrypoints.access_log import LateAccessLog
    from llm_engine.entrypoints.app import create_app
    from llm_engine.entrypoints.ensemble import Ensemble
    from llm_engine.entrypoints.models import resolve_model
    from llm_engine.entrypoints.service import ServerOptions
    from llm_engine.loader.engine_manifest import tuned_options

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    path, name = resolve_model(model or os.environ.get("CODEYARD_LLM_MODEL"))
    keys = api_key or [k for k in [os.environ.get("CODEYARD_LLM_API_KEY")] if k]
    check_disaggregation(disaggregated, role, kv_port, kv_transport, data_parallel_size,
                         tensor_parallel_size, distributed_executor)
    if scheduling_policy not in ("fcfs", "priority"):
        raise typer.BadParameter(f"must be fcfs or priority, got {scheduling_policy!r}", param_hint="--scheduling-policy")
    if max_local_prefill_length and not disaggregated:
        raise typer.BadParameter("applies to the --disaggregated proxy", param_hint="--max-local-prefill-length")
    try:
        pinned = parse_cpus(engine_cpus) if engine_cpus is not None else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--engine-cpus") from None
    if pinned is not None and (data_parallel_size > 1 or disaggregated or tensor_parallel_size > 1):
        raise typer.BadParameter("pins the one engine thread of a single server", param_hint="--engine-cpus")
    servers_on_ray = check_ray_servers(distributed_executor, data_parallel_size > 1 or disaggregated,
                                       ray_placement_strategy)
    if servers_on_ray is not None and tensor_parallel_size == 1:
        distributed_executor = "mp"  # "ray" placed the servers; each one's single rank runs in it
    serve_args = ["--model", path, "--served-model-name", served_model_name or name, "--device", device,
                  "--max-num-seqs", str(max_num_seqs), "--max-waiting", str(max_waiting),
                  "--scheduling-policy", scheduling_policy,
                  "--kv-cache-memory", kv_cache_memory, "--request-timeout", str(request_timeout),
                  "--quantization", quantization, "--tensor-parallel-size", str(tensor_parallel_size),
                  "--distributed-executor", distributed_executor, "--ray-placement-strategy", ray_placement_strategy,
                  "--gpu-memory-utilization", str(gpu_memory_utilization), *(["--enforce-eager"] if enforce_eager else []),
                  "--model-impl", model_impl,
                  *(["--max-num-batched-tokens", str(max_num_batched_tokens)] if max_num_batched_tokens else [])]
    if data_parallel_size > 1 or disaggregated:
        # uvicorn re-raises the SIGTERM that stopped it once it has shut down: as SystemExit, so that
        # the launchers below stop their children (the default action would orphan them)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if data_parallel_size > 1:
        from llm_engine.entrypoints.replicas import replica_servers
        from llm_engine.entrypoints.router import create_router_app

        replicas = replica_servers([*serve_args, *(["--num-threads", str(num_threads)] if num_threads else [])],
                                   data_parallel_size)
        if servers_on_ray is not None:
            from llm_engine.ray_servers import ray_replica_servers

            replicas = ray_replica_servers(serve_in_process, serve_args, data_parallel_size, servers_on_ray,
                                           cpus=num_threads or 1)
        with replicas as (urls, replica_key):
            uvicorn.run(create_router_app(urls, frozenset(keys), replica_key), host=host, port=port, log_level="info")
        return
    if disaggregated:
        from llm_engine.entrypoints.disagg_proxy import create_disagg_app
        from llm_engine.entrypoints.disagg_servers import disaggregated_servers
        from llm_engine.entrypoints.replicas import Servers

        pair_servers: contextlib.AbstractContextManager[Servers] = disaggregated_servers(
            serve_args, kv_transport, cores_per_instance=tensor_parallel_size)
        if servers_on_ray is not None:
            from llm_engine.ray_servers import ray_disaggregated_servers

            pair_servers = ray_disaggregated_servers(serve_in_process, serve_args, kv_transport, servers_on_ray,
                                                     cpus=num_threads or 1)
        with pair_servers as pair:
            app = create_disagg_app(pair.urls[0], pair.urls[1], frozenset(keys), pair.key, max_local_prefill_length)
            uvicorn.run(app, host=host, port=port, log_level="info")
        return
    kv_transfer = None if role is None else {
        "kv_role": "kv_producer" if role == "prefill" else "kv_consumer", "kv_ip": kv_host,
        "kv_port": kv_port or 0, "kv_transport": kv_transport, "kv_key": keys[0] if keys else None}
    threads = num_threads or (len(pinned) if pinned else None)
    tuned = {**tuned_options(path), **({"num_threads": threads} if threads else {}),  # an engine's measured ones (`llm tune`)
             **({"max_num_batched_tokens": max_num_batched_tokens} if max_num_batched_tokens else {})}
    config = EngineConfig(model=path, device=device, max_num_seqs=max_num_seqs, kv_cache_memory=kv_cache_memory,
                          scheduling_policy=scheduling_policy,
                          tensor_parallel_size=tensor_parallel_size, **tuned,
                          distributed_executor_backend=distributed_executor,
                          ray_placement_strategy=ray_placement_strategy,
                          gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
                          model_impl=model_impl, quantization=None if quantization == "none" else quantization,
                          speculative_config=parse_json_option(speculative_config, "--speculative-config"),
                          kv_transfer_config=kv_transfer)
    options = ServerOptions(max_waiting=max_waiting, request_timeout=request_timeout, api_keys=frozenset(keys),
                            grpc_address=f"{host}:{grpc_port}" if grpc_port else None,
                            ensembles=tuple(Ensemble.load(p) for p in ensemble or ()), engine_cpus=pinned,
                            engine_process=engine_process)
    # the access line once a response ends, not on its first token's way out (access_log.LateAccessLog)
    uvicorn.run(create_app(config, served_model_name or name, options), host=host, port=port, log_level="info",
                http=LateAccessLog)


def check_disaggregation(disaggregated: bool, role: str | None, kv_port: int | None, kv_transport: str,
                         data_parallel_size: int, tensor_parallel_size: int, distributed_executor: str) -> None:
    """Usage errors (exit 2) in the disaggregated serving options."""
    if role not in (None, "prefill", "decode"):
        raise typer.BadParameter(f"must be prefill or decode, got {role!r}", param_hint="--role")
    if kv_transport not in ("shm", "socket"):
        raise typer.BadParameter(f"must be shm or socket, got {kv_transport!r}", param_hint="--kv-transport")
    if role == "decode" and kv_port is None:
        raise typer.BadParameter("a decode instance needs the prefill instance's KV port", param_hint="--kv-port")
    if (disaggregated or role) and data_parallel_size > 1:
        raise typer.BadParameter("disaggregated serving runs one instance per role so far",
                                 param_hint="--disaggregated/--role")
    if (disaggregated or role) and tensor_parallel_size > 1 and distributed_executor != "mp":
        raise typer.BadParameter("a disaggregated instance's tensor-parallel ranks run as local processes "
                                 "(its engine maps their KV pools), not on Ray", param_hint="--distributed-executor")
    if disaggregated and role:
        raise typer.BadParameter("--disaggregated starts both roles itself", param_hint="--role")


def serve_in_process(args: list[str]) -> None:
    """`codeyard llm serve <args>` in this process until it stops (a Ray actor's server thread)."""
    typer.main.get_command(app).main(["serve", *args], prog_name="codeyard llm", standalone_mode=False)


def check_ray_servers(distributed_executor: str, several_servers: bool, strategy: str) -> str | None:
    """The placement strategy when the replicas or instances go on Ray, else None; usage errors exit 2."""
    from llm_engine.config import _RAY_PLACEMENT_STRATEGIES as RAY_PLACEMENT_STRATEGIES

    if distributed_executor != "ray" or not several_servers:
        return None
    if importlib.util.find_spec("ray") is None:
        raise typer.BadParameter("ray needs the ray package (pip install 'codeyard[ray]')",
                                 param_hint="--distributed-executor")
    if strategy not in RAY_PLACEMENT_STRATEGIES:
        raise typer.BadParameter(f"must be one of {RAY_PLACEMENT_STRATEGIES}, got {strategy!r}",
                                 param_hint="--ray-placement-strategy")
    return strategy


@app.command()
def quantize(
    source: Annotated[Path, typer.Argument(help="Local Hugging Face model folder (config.json + safetensors).")],
    out: Annotated[Path, typer.Option(help="Folder to write the quantized checkpoint to (new or empty).")],
    method: Annotated[str, typer.Option(help="int8, int4, gptq, awq or fp8 (layouts: see llm_engine/quantize.py).")],
    group_size: Annotated[int | None, typer.Option(help="Inputs per scale (-1: per output channel; default: "
                                                        "128 for 4 bits, per channel for int8).")] = None,
    calibration: Annotated[list[Path] | None, typer.Option(help="Text file for gptq/awq calibration (repeatable; "
                                                           "default: Python standard library sources).")] = None,
    tables: Annotated[str | None, typer.Option(help="The token embedding and LM head: int8 (per vocabulary row, "
                                                    "GPTQ's layout; the default for int8, int4 and gptq) or float "
                                                    "(awq and fp8's only choice; for tools that keep them float).")]
    = None,
    partial_groups: Annotated[bool, typer.Option(help="Allow a --group-size that does not divide the inputs: "
                                                      "each row ends in a shorter group (the engine loads it; "
                                                      "vLLM and AutoAWQ do not).")] = False,
) -> None:
    """Write a quantized copy of SOURCE (one line of progress per layer)."""
    from llm_engine.quantize import quantize_checkpoint

    quant = quantize_checkpoint(source, out, method, group_size, calibration, progress=typer.echo, tables=tables,
                                partial_groups=partial_groups)
    typer.echo(f"wrote {out} ({json.dumps(quant)}); load it with LLM({str(out)!r})")


app.command()(build)
app.command()(tune)
