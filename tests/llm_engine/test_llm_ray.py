"""Tensor-parallel ranks, data-parallel replicas and disaggregated instances on a Ray cluster
(distributed_executor_backend="ray", `--distributed-executor ray`).

The default suite checks the options' clear errors: bad values, one rank, ray missing (where it is
not installed), no cluster reachable (where it is), and the serve CLI's exit 2. `make
test-llm-ray` (CODEYARD_RAY=1) starts a real two-node Ray cluster on this machine (`ray start
--head` and a second `ray start --address`, three CPUs each so that the groups fit, their own
temp dirs and ports, stopped at the end; ray_kit.py) and, with one worker on each node: serves
TP=2 with the same greedy tokens as one rank, from the LLM class and from `codeyard llm serve
--distributed-executor ray` through the openai client, and a killed rank's requests fail cleanly,
every block is freed and a fresh group serves the next ones; serves DP=2 (two CPUs a replica)
behind the router with one engine's answers, and a killed replica's actor ends its stream with a
clear error while the other replica answers, then it is started again at its URL; serves a prefill
and a decode instance whose KV crosses the nodes over a socket, with one engine's answers, and a
killed decode instance's actor ends its stream with a clear error while every prefill block is
freed, then it is started again and requests are split again. Ray's start-up is heavy: minutes on
a busy 2-core machine.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from ray_kit import NODE_START_TIMEOUT_S, RayCluster, free_port, session_members
from tp_kit import assert_same, gone, kill_rank_one_mid_run, prompts, tokens_and_logprobs
from typer.testing import CliRunner

from llm_engine import LLM, SamplingParams
from llm_engine.cli import app as cli_app
from llm_engine.cli import serve_in_process
from llm_engine.config import EngineConfig
from llm_engine.entrypoints.disagg_proxy import create_disagg_app
from llm_engine.entrypoints.replicas import replica_names
from llm_engine.entrypoints.router import create_router_app
from llm_engine.executor import WorkerGroupError
from llm_engine.kv_pool_files import POOL_PREFIX, pool_folder
from tests.llm_serving.conftest import start_server
from tests.llm_serving.test_llm_parallel_disagg import assert_prefill_blocks_free_and_decode_out

HAS_RAY = importlib.util.find_spec("ray") is not None
cluster_test = pytest.mark.skipif(os.environ.get("CODEYARD_RAY") != "1", reason="a Ray cluster: make test-llm-ray")
CODEYARD = str(Path(sys.executable).with_name("codeyard"))


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
@pytest.mark.parametrize(("options", "actor"), [(["--tensor-parallel-size", "2"], "RankActor"),
                                                (["--data-parallel-size", "2"], "ServerActor"),
                                                (["--disaggregated"], "ServerActor")], ids=["tp", "dp", "disagg"])
def test_serve_places_its_workers_on_ray(ray_cluster, tiny_llama_smollm_vocab, options, actor):
    """`codeyard llm serve --distributed-executor ray` as users run it: the ranks, replicas or
    prefill/decode instances go one on each node (Ray actors beside the other tests' groups), the
    completion is one engine's, and the actors end with the server."""
    before = set(session_members(ray_cluster.sessions, actor))
    port = free_port()
    proc = subprocess.Popen([CODEYARD, "llm", "serve", "--model",
                             str(tiny_llama_smollm_vocab), "--port", str(port), "--served-model-name", "tiny",
                             *options, "--distributed-executor", "ray",
                             "--ray-placement-strategy", "STRICT_SPREAD", "--kv-cache-memory", "16MiB"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + NODE_START_TIMEOUT_S
        while not _healthy(port):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "server not ready"
            time.sleep(1)
        for node in ray_cluster.nodes:  # each `ray start` leads the session of its node's processes
            assert len(set(session_members({node.pid}, actor)) - before) == 1
        workers = set(session_members(ray_cluster.sessions, actor)) - before
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        out = client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=8, temperature=0,
                                        extra_body={"ignore_eos": True})
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    one_engine = LLM(str(tiny_llama_smollm_vocab), kv_cache_memory="16MiB").generate(
        "def add(a, b):", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)[0]
    assert out.choices[0].text == one_engine.outputs[0].text
    deadline = time.monotonic() + 60
    while not all(gone(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert all(gone(pid) for pid in workers), f"a {actor} outlived the server"


def test_servers_on_ray_with_a_bad_strategy_or_without_ray_is_exit_2(tiny_llama):
    result = CliRunner().invoke(cli_app, ["serve", "--model", str(tiny_llama), "--data-parallel-size", "2",
                                          "--distributed-executor", "ray", "--ray-placement-strategy", "EVERYWHERE"])
    assert result.exit_code == 2
    assert ("--ray-placement-strategy" if HAS_RAY else "needs the ray package") in result.output


def _healthy(port: int) -> bool:
    return _up(f"http://127.0.0.1:{port}")


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


TEXT_PROMPTS = ["def add(a, b):", "The quick brown fox " * 12, "Write a haiku about compilers.\n" * 5, "Hello"]


@pytest.fixture(scope="module")
def long_text_model(tiny_llama_smollm_vocab, tmp_path_factory) -> Path:
    """The tiny SmolLM2-vocabulary Llama with room for a 3000-token stream (a stream that is still
    running when its replica is killed)."""
    folder = tmp_path_factory.mktemp("long-text-model")
    for file in tiny_llama_smollm_vocab.iterdir():
        (folder / file.name).symlink_to(file)
    config = json.loads((tiny_llama_smollm_vocab / "config.json").read_text())
    (folder / "config.json").unlink()
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    return folder


@pytest.fixture(scope="module")
def one_engine_texts(long_text_model) -> list[str]:
    llm = LLM(str(long_text_model), kv_cache_memory="16MiB")
    outputs = llm.generate(TEXT_PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    return [output.outputs[0].text for output in outputs]


def server_args(model: Path) -> list[str]:
    return ["--model", str(model), "--served-model-name", "tiny", "--kv-cache-memory", "16MiB", "--max-num-seqs", "8"]


def client_for(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


def complete(client: openai.OpenAI, prompt: str, stream: bool = False) -> str:
    kwargs = dict(model="tiny", prompt=prompt, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    if stream:
        return "".join(chunk.choices[0].text for chunk in client.completions.create(stream=True, **kwargs))
    return client.completions.create(**kwargs).choices[0].text


def alive_nodes() -> set[str]:
    import ray

    return {node["NodeID"] for node in ray.nodes() if node["Alive"]}


@cluster_test
def test_replicas_one_per_node_answer_like_one_engine_and_outlive_a_killed_one(ray_cluster, long_text_model,
                                                                               one_engine_texts):
    """DP=2 on Ray with STRICT_SPREAD, two CPUs each: each replica and the router in front give one
    engine's greedy answers; killing the actor of the replica serving a stream ends that stream with
    a clear error, the other replica answers everything after, and the killed one is started again
    in a new actor at its URL, answering as before."""
    import ray
    from ray.util.placement_group import placement_group_table

    from llm_engine.ray_servers import server_group

    with server_group(replica_names(2), "STRICT_SPREAD", cpus=2) as group:
        servers = group.serve(serve_in_process, [server_args(long_text_model)] * 2, NODE_START_TIMEOUT_S)
        assert {place.node_id for place in servers.places} == alive_nodes()  # one replica on each node
        assert [bundle["CPU"] for bundle in placement_group_table(group.placement)["bundles"].values()] == [2, 2]
        # each server's torch threads: its bundle's CPUs (Ray's OMP_NUM_THREADS is 1 for a one-CPU actor)
        assert all(command[command.index("--num-threads") + 1] == "2" for command in group.commands)
        for url in servers.urls:
            assert [complete(client_for(url, servers.key), p) for p in TEXT_PROMPTS] == one_engine_texts
        router = start_server(create_router_app(servers.urls, frozenset({"outer"}), servers.key))
        try:
            front = client_for(router.url, "outer")
            with ThreadPoolExecutor(len(TEXT_PROMPTS)) as pool:
                assert list(pool.map(lambda p: complete(front, p, stream=True), TEXT_PROMPTS)) == one_engine_texts
            stream = iter(front.completions.create(model="tiny", prompt="Once upon a time", max_tokens=3000,
                                                   temperature=0, stream=True, extra_body={"ignore_eos": True}))
            received = [next(stream).choices[0].text]
            serving = router.app.state.router.in_flight.index(1)
            ray.kill(servers.actors[serving], no_restart=True)
            with pytest.raises(openai.APIError, match=f"replica {serving + 1} failed during this request"):
                received.extend(chunk.choices[0].text for chunk in stream)
            assert len(received) < 3000
            assert httpx.get(router.url + "/health", timeout=10).json()["alive"] == 1
            assert [complete(front, p) for p in TEXT_PROMPTS] == one_engine_texts  # all on the other replica
            killed_pid = servers.places[serving].pid
            deadline = time.monotonic() + NODE_START_TIMEOUT_S
            while not _up(servers.urls[serving]) and time.monotonic() < deadline:
                time.sleep(1)
            assert group.supervisor is not None and group.supervisor.restarts == 1
            assert servers.places[serving].pid != killed_pid  # a new actor, at the same URL
            back = client_for(servers.urls[serving], servers.key)
            assert [complete(back, p) for p in TEXT_PROMPTS] == one_engine_texts
        finally:
            router.stop()
    deadline = time.monotonic() + 30
    while session_members(ray_cluster.sessions, "ServerActor") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not session_members(ray_cluster.sessions, "ServerActor"), "a replica's actor outlived its group"


def counter(url: str, key: str, name: str) -> float:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=10).text
    return float(re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M).group(1))


@cluster_test
def test_prefill_and_decode_instances_on_two_nodes_answer_like_one_engine_and_a_killed_decode_fails_cleanly(
        ray_cluster, long_text_model, one_engine_texts):
    """Disaggregated serving on Ray with STRICT_SPREAD: the decode instance pulls the prompts' KV from
    the prefill instance's node over the socket transport (it computes only each last prompt token),
    and a mixed batch, streamed and not, gets one engine's greedy answers. Killing the decode
    instance's actor mid-stream ends that stream with the proxy's error, every block of the prefill
    instance is freed, requests then run whole on the prefill instance, and once the decode instance
    is started again (a new actor at its URL) they are split again. Once the group stops,
    no KV pool file of the prefill instance is left in /dev/shm."""
    import ray

    from llm_engine.ray_servers import ray_disaggregated_servers

    with ray_disaggregated_servers(serve_in_process, server_args(long_text_model), "shm", "STRICT_SPREAD",
                                   NODE_START_TIMEOUT_S) as pair:
        assert {place.node_id for place in pair.places} == alive_nodes()
        proxy = start_server(create_disagg_app(pair.urls[0], pair.urls[1], frozenset({"outer"}), pair.key))
        try:
            split = client_for(proxy.url, "outer")
            with ThreadPoolExecutor(len(TEXT_PROMPTS)) as pool:
                answers = list(pool.map(lambda job: complete(split, job[1], stream=job[0] % 2 == 0),
                                        enumerate(TEXT_PROMPTS)))
            assert answers == one_engine_texts
            computed = counter(pair.urls[1], pair.key, "vllm:iteration_tokens_total_sum")
            assert computed == len(TEXT_PROMPTS) * 8  # per request its last prompt token, then 7 decode steps

            stream = iter(split.completions.create(model="tiny", prompt="Once upon a time", max_tokens=3000,
                                                   temperature=0, stream=True, extra_body={"ignore_eos": True}))
            received = [next(stream).choices[0].text]
            ray.kill(pair.actors[1], no_restart=True)
            with pytest.raises(openai.APIError, match="the decode instance failed during this request"):
                received.extend(chunk.choices[0].text for chunk in stream)
            assert len(received) < 3000
            assert_prefill_blocks_free_and_decode_out(pair.urls[0], pair.key, proxy.url)
            assert complete(split, TEXT_PROMPTS[0]) == one_engine_texts[0]  # whole on the prefill instance
            # the decode instance is started again in a new actor at its URL, and the proxy splits again
            deadline = time.monotonic() + NODE_START_TIMEOUT_S
            while not _up(pair.urls[1]) and time.monotonic() < deadline:
                time.sleep(1)
            while counter(pair.urls[1], pair.key, "vllm:iteration_tokens_total_sum") == 0:
                assert time.monotonic() < deadline, "the proxy never split a request again"
                assert complete(split, TEXT_PROMPTS[0]) == one_engine_texts[0]
                time.sleep(1)
            assert counter(pair.urls[1], pair.key, "vllm:iteration_tokens_total_sum") == 8  # pulled, not recomputed
        finally:
            proxy.stop()
    # ray.kill skipped the prefill instance's own cleanup: stopping the group swept its KV pool file
    assert not list(pool_folder().glob(f"{POOL_PREFIX}{pair.places[0].pid}-*"))
