"""Tensor-parallel ranks on a Ray cluster (distributed_executor_backend="ray").

The default suite checks the option's clear errors: bad values, one rank, ray missing (where it is
not installed) and no cluster reachable (where it is). `make test-llm-ray` (CODEYARD_RAY=1) starts
a real two-node Ray cluster on this machine (`ray start --head` and a second `ray start --address`,
two CPUs each so that two groups fit, their own temp dirs and ports, stopped at the end) and serves
TP=2 with one rank on each node: the same greedy tokens as one rank, from the LLM class and from
`codeyard llm serve --distributed-executor ray` through the openai client, and a killed rank's
requests fail cleanly, every block is freed and a fresh group serves the next ones. Ray's start-up
is heavy: minutes on a busy 2-core machine.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from tp_kit import assert_same, gone, kill_rank_one_mid_run, prompts, tokens_and_logprobs

from llm_engine import LLM, SamplingParams
from llm_engine.config import EngineConfig
from llm_engine.executor import WorkerGroupError

HAS_RAY = importlib.util.find_spec("ray") is not None
cluster_test = pytest.mark.skipif(os.environ.get("CODEYARD_RAY") != "1", reason="a Ray cluster: make test-llm-ray")
RAY = str(Path(sys.executable).with_name("ray"))
NODE_START_TIMEOUT_S = 300


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(distributed_executor_backend="dask"), "distributed_executor_backend: must be one of"),
    (dict(distributed_executor_backend="ray", ray_placement_strategy="EVERYWHERE"),
     "ray_placement_strategy: must be one of"),
    (dict(distributed_executor_backend="ray", tensor_parallel_size=1), "places the ranks of tensor_parallel_size > 1"),
])
def test_bad_executor_options_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(model="/nowhere", tensor_parallel_size=kwargs.pop("tensor_parallel_size", 2), **kwargs)


@pytest.mark.skipif(HAS_RAY, reason="ray is installed here")
def test_ray_not_installed_is_a_clear_error():
    with pytest.raises(ValueError, match=r"needs the ray package \(pip install 'codeyard\[ray\]'\)"):
        EngineConfig(model="/nowhere", tensor_parallel_size=2, distributed_executor_backend="ray")


@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed")
def test_no_reachable_cluster_is_a_clear_error(tiny_llama, monkeypatch):
    """A closed port: the engine never starts a cluster of its own."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{closed}")
    with pytest.raises(WorkerGroupError, match=f"no Ray cluster reachable at RAY_ADDRESS=127.0.0.1:{closed}"):
        LLM(str(tiny_llama), dtype="float32", tensor_parallel_size=2, distributed_executor_backend="ray")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _session_members(sids: set[int], named: str = "") -> list[int]:
    """Processes in the given sessions (each Ray node's processes share its `ray start`'s session),
    those whose command line has `named` in it when given (Ray titles an actor's process ray::Class)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[3]) in sids and named in cmdline:
                members.append(int(entry.name))
    return members


class RayCluster:
    """A head and a worker node on this machine, each `ray start --block` in a session of its own, so
    that stopping the cluster ends exactly its processes (not `ray stop`, which ends every Ray process
    on the machine)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes: list[subprocess.Popen[bytes]] = []
        self.address = f"127.0.0.1:{_free_port()}"

    def start(self) -> None:
        common = ["--block", "--num-cpus", "2", "--disable-usage-stats", "--node-ip-address", "127.0.0.1",
                  "--min-worker-port", "0", "--max-worker-port", "0", "--object-store-memory", str(80 * 2**20)]
        head = ["--head", "--port", self.address.rsplit(":", 1)[1], "--include-dashboard", "false",
                "--dashboard-port", str(_free_port()), "--ray-client-server-port", str(_free_port())]
        self._start_node("head", [*head, *common])
        self._wait_for_nodes(1)
        self._start_node("worker", ["--address", self.address, *common])
        self._wait_for_nodes(2)

    def _start_node(self, name: str, args: list[str]) -> None:
        node_args = ["--temp-dir", str(self.root / name), "--dashboard-agent-listen-port", str(_free_port()),
                     "--node-manager-port", str(_free_port()), "--object-manager-port", str(_free_port())]
        log = (self.root / f"{name}.log").open("wb")
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
        env.pop("RAY_ADDRESS", None)
        self.nodes.append(subprocess.Popen([RAY, "start", *args, *node_args], stdout=log, stderr=subprocess.STDOUT,
                                           env=env, start_new_session=True))

    def _wait_for_nodes(self, count: int) -> None:
        """Until the cluster lists `count` live nodes (`ray status` asks the head)."""
        deadline = time.monotonic() + NODE_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if any(node.poll() is not None for node in self.nodes):
                pytest.fail(f"a Ray node exited while starting; see {self.root}/*.log")
            status = subprocess.run([RAY, "status", "--address", self.address], capture_output=True, text=True)
            if status.returncode == 0 and status.stdout.count(" node_") >= count:
                return
            time.sleep(2)
        pytest.fail(f"the Ray cluster did not list {count} nodes within {NODE_START_TIMEOUT_S} s")

    @property
    def sessions(self) -> set[int]:
        return {node.pid for node in self.nodes}  # each `ray start` leads its own session

    def stop(self) -> None:
        sids = self.sessions
        for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            for pid in _session_members(sids):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait_s
            while _session_members(sids) and time.monotonic() < deadline:
                time.sleep(0.2)
        for node in self.nodes:
            node.wait(timeout=5)
        left = _session_members(sids)
        assert not left, f"Ray processes outlived the cluster: {left}"


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    cluster = RayCluster(Path(tmp_path_factory.mktemp("ray", numbered=True)))
    try:
        cluster.start()
        os.environ["RAY_ADDRESS"] = cluster.address
        yield cluster
    finally:
        os.environ.pop("RAY_ADDRESS", None)
        if "ray" in sys.modules:
            import ray

            ray.shutdown()  # this process's driver, before its cluster goes
        cluster.stop()


@pytest.fixture(scope="module")
def one_rank_tokens(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory="8MiB")
    return tokens_and_logprobs(llm, prompts())


@pytest.fixture(scope="module")
def ray_llm(ray_cluster, tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory="8MiB", tensor_parallel_size=2,
              distributed_executor_backend="ray", ray_placement_strategy="STRICT_SPREAD")
    yield llm
    pids = llm.engine.model_runner.pids
    llm.engine.shutdown()
    deadline = time.monotonic() + 30
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(gone(pid) for pid in pids), "a rank's actor outlived shutdown"


@cluster_test
def test_tp2_across_two_nodes_matches_one_rank(ray_llm, one_rank_tokens):
    import ray

    runner = ray_llm.engine.model_runner
    alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    assert len(alive) == 2 and set(runner.nodes) == alive  # one rank on each node
    assert_same(tokens_and_logprobs(ray_llm, prompts()), one_rank_tokens)
    assert_same(tokens_and_logprobs(ray_llm, prompts()), one_rank_tokens)  # again: now from the prefix cache
    stats = ray_llm.engine.get_stats()
    assert stats.prefix_cache_hits > 0
    assert stats.num_free_blocks == stats.num_total_blocks


@cluster_test
def test_killed_rank_fails_its_requests_and_a_fresh_group_serves(ray_llm, one_rank_tokens):
    engine = ray_llm.engine
    old = kill_rank_one_mid_run(engine, prompts(), timeout_s=600)  # rank 1 is an actor process on this machine
    assert gone(old[1])
    assert len(set(engine.model_runner.nodes)) == 2 and set(engine.model_runner.pids).isdisjoint(old)
    assert_same(tokens_and_logprobs(ray_llm, prompts()), one_rank_tokens)  # served by the fresh group


@cluster_test
def test_a_cluster_without_room_is_a_clear_error(ray_cluster, tiny_llama, monkeypatch):
    """Three ranks on different nodes of a two-node cluster: said within the placement timeout."""
    import llm_engine.ray_executor as ray_executor

    monkeypatch.setattr(ray_executor, "PLACEMENT_TIMEOUT_S", 5)
    with pytest.raises(WorkerGroupError, match="cannot place 3 ranks of one CPU each with strategy STRICT_SPREAD"):
        LLM(str(tiny_llama), dtype="float32", kv_cache_memory="8MiB", tensor_parallel_size=3,
            distributed_executor_backend="ray", ray_placement_strategy="STRICT_SPREAD")


@cluster_test
def test_serve_places_the_ranks_on_ray(ray_cluster, tiny_llama_smollm_vocab):
    """`codeyard llm serve --distributed-executor ray` as users run it: the completion one rank gives,
    and the server's ranks (Ray actors beside the other test's group) end with it."""
    before = set(_session_members(ray_cluster.sessions, "RankActor"))
    port = _free_port()
    proc = subprocess.Popen([str(Path(sys.executable).with_name("codeyard")), "llm", "serve", "--model",
                             str(tiny_llama_smollm_vocab), "--port", str(port), "--served-model-name", "tiny",
                             "--tensor-parallel-size", "2", "--distributed-executor", "ray",
                             "--ray-placement-strategy", "STRICT_SPREAD", "--kv-cache-memory", "16MiB"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + NODE_START_TIMEOUT_S
        while not _healthy(port):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "server not ready"
            time.sleep(1)
        ranks = set(_session_members(ray_cluster.sessions, "RankActor")) - before
        assert len(ranks) == 2
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        out = client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=8, temperature=0,
                                        extra_body={"ignore_eos": True})
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    one_rank = LLM(str(tiny_llama_smollm_vocab), kv_cache_memory="16MiB").generate(
        "def add(a, b):", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)[0]
    assert out.choices[0].text == one_rank.outputs[0].text
    deadline = time.monotonic() + 60
    while not all(gone(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert all(gone(pid) for pid in ranks), "a rank's actor outlived the server"


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
