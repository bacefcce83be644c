"""Where a workload is sent: the engine in this process (`offline`), or a server over /v1, /v2
(generate_stream) or gRPC (ModelStreamInfer). Every target streams, so each one times the first
token and the gaps between tokens the same way: on arrival of the piece that carries them.

`Server` starts `codeyard llm serve` (HTTP and gRPC) in its own interpreter, as deployed, or
points at one that runs already (`--url`, `--grpc`). A probe samples the serving process's
memory and the KV-cache usage while a phase runs, and `cpu` reads the serving process's CPU time
split into the engine's threads and the rest (the serving layers' cost, which the machine's other
load does not inflate the way it inflates latency). `engine_ttft` reads the engine's own TTFT
(from the moment the request reached `generate` to its first token), so a phase's TTFT splits into
the engine's part and the rest: the protocol's parsing, tokenizing and hand-offs on a server; on
the offline target, only the hand-off of the first output to its in-process consumer.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx

from benchmarks.framework.workloads import Item, Phase


@dataclass
class Sample:
    """One request as its client saw it (perf_counter seconds)."""

    ok: bool
    start: float = 0.0
    first: float = 0.0
    finish: float = 0.0
    tokens: int = 0
    gaps: list[float] = field(default_factory=list)
    error: str = ""


class _Clock:
    """Turns a stream of (new tokens) pieces into a Sample."""

    def __init__(self) -> None:
        self.sample = Sample(True, start=time.perf_counter())
        self._last: float | None = None

    def piece(self, new_tokens: int, at: float | None = None) -> None:
        """`at`: when the client had the piece (perf_counter), if not now."""
        if new_tokens <= 0:
            return
        now = time.perf_counter() if at is None else at
        if self._last is None:
            self.sample.first = now
        else:
            self.sample.gaps.append(now - self._last)
        self._last = now
        self.sample.tokens += new_tokens

    def done(self) -> Sample:
        self.sample.finish = time.perf_counter()
        if self._last is None:
            return Sample(False, error="no output")
        return self.sample


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_split(pid: int) -> tuple[float, float, float]:
    """(CPU seconds of the engine threads, of the whole server, seconds the engine threads waited for
    a CPU while runnable), over the process and its children (a server's engine-core process).
    AsyncLLMEngine names its loop thread in the OS, and torch's workers started from it inherit the
    name (in the core process every thread has it); their times are read in nanoseconds (schedstat:
    run time, run-queue wait). The whole comes from each process's stat (10 ms units), which keeps
    the time of threads that have ended, so the rest is whole - engine (event loop, gRPC, client). The
    wait is the machine's share of a slow run: an engine that waited for a core lost that time to
    whatever else ran there, not to its protocol."""
    import psutil

    # here, not at the top: the gate's baseline worker imports this module over an older engine
    # (gate.json's commit predates the name; its same-run A/B failed on that import from 0bdbae1 on)
    from llm_engine.async_engine import ENGINE_THREAD

    engine = wait = whole = 0.0
    try:
        pids = [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        pids = [pid]
    for one in pids:
        proc = Path(f"/proc/{one}")
        try:
            for task in (proc / "task").iterdir():
                try:
                    if (task / "comm").read_text().strip() == ENGINE_THREAD:
                        ran, waited = (task / "schedstat").read_text().split()[:2]
                        engine, wait = engine + int(ran) / 1e9, wait + int(waited) / 1e9
                except (FileNotFoundError, ProcessLookupError):  # ended meanwhile
                    continue
            stat = (proc / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after the name, which may hold spaces: utime, stime at 11, 12
        whole += (int(fields[11]) + int(fields[12])) / _TICKS
    return engine, whole, wait


# ----- offline ------------------------------------------------------------------------------------

class Offline:
    """The AsyncLLMEngine in this process: the engine's own speed, no protocol at all."""

    name = "offline"

    def __init__(self, model: str, max_num_seqs: int, slowdown: float = 0.0, cpus: frozenset[int] | None = None,
                 **engine_kwargs) -> None:
        from llm_engine.async_engine import AsyncLLMEngine
        from llm_engine.config import EngineConfig

        if slowdown:
            inject_slowdown(slowdown)
        self.peak_kv = 0.0
        self.ttft_sum, self.ttft_count = 0.0, 0
        if cpus:
            engine_kwargs["num_threads"] = len(cpus)
        self.engine = AsyncLLMEngine(EngineConfig(model=model, max_num_seqs=max_num_seqs, **engine_kwargs),
                                     max_waiting=1_000_000, on_step=self._on_step, cpus=cpus)
        self.engine.start()
        self.engine.wait_ready(600)

    async def send(self, item: Item) -> Sample:
        from llm_engine.sampling_params import SamplingParams

        params = SamplingParams(max_tokens=item.max_tokens, temperature=0, ignore_eos=True)
        clock, seen = _Clock(), 0
        async for out in self.engine.generate(item.prompt, params, uuid.uuid4().hex):
            if not seen and out.metrics.ttft is not None:
                self.ttft_sum, self.ttft_count = self.ttft_sum + out.metrics.ttft, self.ttft_count + 1
            n = len(out.outputs[0].token_ids)
            clock.piece(n - seen)
            seen = n
        return clock.done()

    def _on_step(self, stats, _outputs) -> None:
        self.peak_kv = max(self.peak_kv, stats.kv_cache_usage)

    def probe(self) -> tuple[int, float]:
        """(peak RSS of this process, peak KV usage over the steps since the last probe)."""
        peak, self.peak_kv = self.peak_kv, 0.0
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, peak

    def cpu(self) -> tuple[float, float, float] | None:
        """This process's CPU split: the engine and, beside it, the in-process consumer of its outputs."""
        return cpu_split(os.getpid())

    def engine_ttft(self) -> tuple[float, int]:
        """(seconds, requests) of the engine's TTFT summed over the requests sent so far."""
        return self.ttft_sum, self.ttft_count

    async def aclose(self) -> None:
        self.engine.stop()


def inject_slowdown(fraction: float) -> None:
    """Make every engine step sleep `fraction` of its own duration: the regression the CI gate
    must catch (a proof of the detector, never used otherwise)."""
    from llm_engine.llm_engine import LLMEngine

    step = LLMEngine.step

    def slow_step(self):
        started = time.perf_counter()
        outputs = step(self)
        time.sleep(fraction * (time.perf_counter() - started))
        return outputs

    LLMEngine.step = slow_step


# ----- servers ------------------------------------------------------------------------------------

class Server:
    """A `codeyard llm serve` subprocess with HTTP and gRPC, or an existing server's addresses.

    `engine_cpus` pins its engine thread (`--engine-cpus`) and `other_cpus` the rest of the process
    (event loop, gRPC threads), as the offline target's engine thread and its consumer are pinned:
    with the whole server on the engine's CPU, its serving threads took that CPU from the engine
    while the offline target's consumer ran beside it, so the comparison charged the servers for
    sharing a core rather than for their protocol (whose CPU is counted apart, `cpu`). `engine`:
    "process" (`--engine-process`: the engine core in its own process, on the engine's CPUs) or
    "thread" (`--engine-thread`); None leaves the server's default."""

    def __init__(self, model: str | None = None, max_num_seqs: int = 32, url: str | None = None,
                 grpc: str | None = None, api_key: str | None = None, name: str = "bench",
                 engine_cpus: frozenset[int] | None = None, other_cpus: frozenset[int] | None = None,
                 engine: str | None = None) -> None:
        self.proc: subprocess.Popen | None = None
        self.api_key = api_key
        self.name = name
        if url is not None:
            self.url, self.grpc = url.rstrip("/"), grpc
            self.name = httpx.get(self.url + "/v1/models", headers=self.headers, timeout=10).json()["data"][0]["id"]
            return
        port, grpc_port = free_port(), free_port()
        self.url, self.grpc = f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"
        cmd = [str(Path(sys.executable).parent / "codeyard"), "llm", "serve", "--port", str(port), "--grpc-port",
               str(grpc_port), "--max-num-seqs", str(max_num_seqs), "--max-waiting", "1000000",
               "--served-model-name", name]
        if model:
            cmd += ["--model", model]
        if engine_cpus:
            cmd += ["--engine-cpus", ",".join(map(str, sorted(engine_cpus)))]
        if engine:
            cmd += [f"--engine-{engine}"]  # process or thread (else the server's default)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=(lambda: os.sched_setaffinity(0, other_cpus)) if other_cpus else None)
        deadline = time.monotonic() + 600
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited with code {self.proc.returncode}")
            if time.monotonic() > deadline:
                self.close()
                raise SystemExit("the server did not become ready in 600 s")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def probe(self) -> tuple[int, float]:
        """(peak-so-far RSS of the server process or 0 when remote, KV usage from /metrics)."""
        rss = 0
        if self.proc is not None:
            import psutil

            server = psutil.Process(self.proc.pid)
            rss = sum(p.memory_info().rss for p in [server, *server.children(recursive=True)])
        try:
            text = httpx.get(self.url + "/metrics", headers=self.headers, timeout=2).text
        except httpx.HTTPError:
            return rss, 0.0
        kv = next((float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:kv_cache_usage_perc{")), 0.0)
        return rss, kv

    def cpu(self) -> tuple[float, float, float] | None:
        """The server process's CPU split (None for a server this benchmark did not start)."""
        return cpu_split(self.proc.pid) if self.proc is not None else None

    def engine_ttft(self) -> tuple[float, int] | None:
        """(seconds, requests) of the engine's TTFT over the finished requests, from the server's
        vllm:time_to_first_token_seconds histogram (None when /metrics cannot be read)."""
        try:
            text = httpx.get(self.url + "/metrics", headers=self.headers, timeout=10).text
        except httpx.HTTPError:
            return None
        totals: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith(("vllm:time_to_first_token_seconds_sum{", "vllm:time_to_first_token_seconds_count{")):
                name, value = line.split("{", 1)[0], float(line.rsplit(" ", 1)[1])
                totals[name] = totals.get(name, 0.0) + value
        if len(totals) < 2:
            return None
        return totals["vllm:time_to_first_token_seconds_sum"], int(totals["vllm:time_to_first_token_seconds_count"])

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(60)


class _OverServer:
    """An HTTP target: streamed POSTs through aiohttp, as vLLM's serving benchmark sends them. The
    client shares its CPUs with the server's event loop (--client-cpus), so its cost shows in the
    latency it measures: httpx took ~2x aiohttp's CPU per streamed request (20 vs 11 ms for 16
    tokens, alternating in one process), time the server's event loop waited for its CPU. Its pool
    is warmed before each timed phase (`prepare`), and `connections_opened` counts the connections
    it opened, so a phase says how many it still had to open on the clock."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.session: aiohttp.ClientSession | None = None
        self.connections_opened = 0

    def _session(self) -> aiohttp.ClientSession:
        if self.session is None:  # on the running event loop, which aiohttp binds it to
            opened = aiohttp.TraceConfig()
            opened.on_connection_create_end.append(self._opened)
            self.session = aiohttp.ClientSession(
                self.server.url, headers=self.server.headers, timeout=aiohttp.ClientTimeout(total=600),
                # uvicorn closes a connection idle for 5 s: reusing one in that window raced its close
                # (one ServerDisconnectedError at a phase's start), so idle ones go sooner here
                connector=aiohttp.TCPConnector(limit=1000, keepalive_timeout=4), trace_configs=[opened])
        return self.session

    async def _opened(self, *_) -> None:
        self.connections_opened += 1

    async def prepare(self, phase: Phase) -> None:
        """Open as many keep-alive connections as the phase has requests, before its clock starts, as
        a real client's pool has them (the openai client, tritonclient, the IDE's assistant): the
        previous phase's connections have idled out by then (uvicorn closes them after 5 s)."""
        session = self._session()

        async def ping() -> None:
            async with session.get("/v2/health/live") as answer:
                await answer.read()

        await asyncio.gather(*(ping() for _ in range(min(len(phase.items), 1000))))

    def probe(self) -> tuple[int, float]:
        return self.server.probe()

    def cpu(self) -> tuple[float, float, float] | None:
        return self.server.cpu()

    def engine_ttft(self) -> tuple[float, int] | None:
        return self.server.engine_ttft()

    async def stream(self, path: str, body: dict, tokens) -> Sample:
        """POST `body` and time the SSE events that `tokens(event)` counts (an event with an
        error ends the request as failed)."""
        clock = _Clock()
        try:
            async with self._session().post(path, json=body) as r:
                if r.status != 200:
                    return Sample(False, error=f"HTTP {r.status}")
                async for raw in r.content:
                    line = raw.decode().rstrip("\r\n")
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        return Sample(False, error=str(event["error"]))
                    clock.piece(tokens(event))
        except (TimeoutError, aiohttp.ClientError) as exc:
            return Sample(False, error=f"{type(exc).__name__}: {exc}")
        return clock.done()

    async def aclose(self) -> None:
        if self.session is not None:
            await self.session.close()


class V1(_OverServer):
    """POST /v1/completions, streamed, usage counted from the chunks' text pieces."""

    name = "v1"

    async def send(self, item: Item) -> Sample:
        body = {"model": self.server.name, "prompt": item.prompt, "max_tokens": item.max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True}
        return await self.stream("/v1/completions", body,
                                 lambda chunk: 1 if chunk["choices"] else 0)  # /v1 sends one chunk per new token


class V2(_OverServer):
    """POST /v2/models/{name}/generate_stream (Triton's generate extension)."""

    name = "v2"

    async def send(self, item: Item) -> Sample:
        body = {"text_input": item.prompt, "max_tokens": item.max_tokens, "temperature": 0, "ignore_eos": True}
        return await self.stream(f"/v2/models/{self.server.name}/generate_stream", body,
                                 lambda event: event["num_output_tokens"])


class Grpc:
    """ModelStreamInfer with stream=true through tritonclient.grpc: every request on one stream
    (the server runs a stream's requests concurrently, as Triton does), its responses routed back
    by request id. One stream, not one per request: tritonclient starts a thread per stream, and
    the client's CPU is not what is measured.

    The threaded client, not grpc.aio: grpc.aio allows one event loop per process, and a test
    may already run the server's there."""

    name = "grpc"

    def __init__(self, server: Server) -> None:
        self.server = server
        self.client = None
        self.pending: dict[str, asyncio.Queue] = {}
        self.loop: asyncio.AbstractEventLoop | None = None

    def probe(self) -> tuple[int, float]:
        return self.server.probe()

    def cpu(self) -> tuple[float, float, float] | None:
        return self.server.cpu()

    def engine_ttft(self) -> tuple[float, int] | None:
        return self.server.engine_ttft()

    def _on_response(self, result, error) -> None:
        """tritonclient's stream thread: hand the piece to its request's queue on the event loop,
        stamped now: the client has it here, in tritonclient's callback (the user's receipt); the hop
        to this benchmark's event loop is its own plumbing, not the protocol's."""
        received = time.perf_counter()
        request_id = result.get_response().id if result is not None else None
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._route, request_id, result, error, received)

    def _route(self, request_id, result, error, received: float) -> None:
        for key in [request_id] if request_id in self.pending else list(self.pending):  # an error names no id
            self.pending[key].put_nowait((result, error, received))

    async def send(self, item: Item) -> Sample:
        import numpy as np
        import tritonclient.grpc as grpcclient

        if self.client is None:
            self.loop = asyncio.get_running_loop()
            self.client = grpcclient.InferenceServerClient(self.server.grpc)
            self.client.start_stream(self._on_response, headers=self.server.headers or None)
        tensors = []
        for name, datatype, value in (("text_input", "BYTES", np.array([[item.prompt.encode()]], dtype=object)),
                                      ("max_tokens", "INT32", np.array([[item.max_tokens]], dtype=np.int32)),
                                      ("temperature", "FP32", np.array([[0.0]], dtype=np.float32)),
                                      ("ignore_eos", "BOOL", np.array([[True]])),
                                      ("stream", "BOOL", np.array([[True]]))):
            tensor = grpcclient.InferInput(name, list(value.shape), datatype)
            tensor.set_data_from_numpy(value)
            tensors.append(tensor)
        request_id = uuid.uuid4().hex
        pieces: asyncio.Queue = asyncio.Queue()
        self.pending[request_id] = pieces
        clock = _Clock()
        try:
            self.client.async_stream_infer(self.server.name, tensors, request_id=request_id)
            while True:
                result, error, received = await pieces.get()
                if error is not None:
                    return Sample(False, error=str(error))
                clock.piece(int(result.as_numpy("num_output_tokens").sum()), at=received)
                if result.get_response().parameters["triton_final_response"].bool_param:
                    return clock.done()
        finally:
            del self.pending[request_id]

    async def aclose(self) -> None:
        if self.client is not None:
            self.client.stop_stream()
            self.client.close()


def make_target(kind: str, server: Server | None, offline_args: dict):
    if kind == "offline":
        return Offline(**offline_args)
    if server is None:
        raise SystemExit(f"target {kind} needs a server")
    return {"v1": V1, "v2": V2, "grpc": Grpc}[kind](server)


def machine_load() -> float:
    return os.getloadavg()[0]
