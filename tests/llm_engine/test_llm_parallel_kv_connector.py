"""Disaggregated prefill/decode at the engine level: a prefill engine keeps a prompt's KV, a
decode engine pulls it over the KV connector's shared memory and gives the same greedy tokens as
one engine; the socket transport brings the very same bytes. The decode side pulls only the blocks its prefix cache
lacks. Every block is freed on both sides, after failed transfers too. Pulls run beside the
steps: a pull waiting on its answer stalls no other request. A killed producer's pool file
is swept, a live one's kept; a consumer maps only its current producer's pool. The served pair behind
the proxy is tested in tests/llm_serving/test_llm_parallel_disagg.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from llm_engine import LLM, SamplingParams
from llm_engine.kv_connector import KVConnector, KVShard, KVTransferConfig, copy_blocks, token_hash
from llm_engine.kv_pool_files import sweep_dead_pools
from llm_engine.sequence import Request

KEY = "kv-secret"
BS = 16
# a mixed batch: short and long, one block exactly, two sharing a 48-token prefix
PROMPTS = [[5, 9, 13], list(range(3, 20)), [7] * 16 + [8], list(range(10, 80)),
           list(range(100, 148)) + [3, 4, 5], list(range(100, 148)) + [9, 9, 9, 9, 9, 9, 9, 9, 9]]
GREEDY = dict(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def expected(tiny_llama) -> list[list[int]]:
    """What one engine generates for PROMPTS."""
    outs = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=64).generate(PROMPTS, SamplingParams(**GREEDY),
                                                                            use_tqdm=False)
    return [out.outputs[0].token_ids for out in outs]


@pytest.fixture(scope="module")
def producer(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=64,
              kv_transfer_config={"kv_role": "kv_producer", "kv_key": KEY})
    yield llm
    llm.engine.shutdown()


@pytest.fixture(scope="module")
def consumer(tiny_llama, producer):
    return consumer_for(tiny_llama, producer)


def consumer_for(folder, producer: LLM, **config) -> LLM:
    kv = {"kv_role": "kv_consumer", "kv_port": producer.engine.kv_connector.port, "kv_key": KEY, **config}
    return LLM(str(folder), dtype="float32", num_kv_blocks=64, kv_transfer_config=kv)


def prefill(producer: LLM, prompts: list[list[int]]) -> list[dict]:
    outs = producer.generate(prompts, SamplingParams(temperature=0, max_tokens=1,
                                                     kv_transfer_params={"do_remote_decode": True}), use_tqdm=False)
    return [out.kv_transfer_params for out in outs]


def decode(consumer: LLM, prompts: list[list[int]], transfers: list[dict]) -> list:
    params = [SamplingParams(**GREEDY, kv_transfer_params=t) for t in transfers]
    return consumer.generate(prompts, params, use_tqdm=False)


def assert_all_free(*llms: LLM) -> None:
    for llm in llms:
        llm.engine.release_kv_holds()
        stats = llm.engine.get_stats()
        assert stats.num_free_blocks == stats.num_total_blocks


def pull(producer: LLM, ask: dict) -> dict:
    """One raw pull request on the producer's KV port; its first answer (the socket then closes)."""
    with socket.create_connection(("127.0.0.1", producer.engine.kv_connector.port)) as sock:
        sock.sendall(json.dumps(ask).encode() + b"\n")
        return json.loads(sock.makefile("rb").readline())


def test_transfers_give_one_engines_tokens_and_skip_cached_blocks(expected, producer, consumer):
    outs = decode(consumer, PROMPTS, prefill(producer, PROMPTS))
    assert [out.outputs[0].token_ids for out in outs] == expected
    assert all(out.error is None for out in outs)
    first_pass = consumer.engine.kv_connector.blocks_received
    # the two prompts sharing a prefix were admitted in the same step: both pulled it
    assert first_pass == sum(-(-(len(p) - 1) // BS) for p in PROMPTS)

    hits_before = producer.engine.get_stats().prefix_cache_hits
    outs = decode(consumer, PROMPTS, prefill(producer, PROMPTS))  # both sides cache these prompts now
    assert [out.outputs[0].token_ids for out in outs] == expected
    assert producer.engine.get_stats().prefix_cache_hits > hits_before
    # only each prompt's partial last block comes again; full blocks are in the decode side's cache
    assert consumer.engine.kv_connector.blocks_received - first_pass == sum(1 for p in PROMPTS if (len(p) - 1) % BS)
    assert_all_free(producer, consumer)
    assert producer.engine.kv_connector.num_held_blocks() == 0


def test_socket_transfers_bring_the_same_bytes(producer):
    """The socket transport (between hosts) fills a pool with exactly the producer's blocks."""
    source = producer.engine.kv_connector.shards[0].pool
    prompt = PROMPTS[3]  # 70 tokens: 4 full blocks and a partial one
    transfer = prefill(producer, [prompt])[0]
    full = producer.engine.block_manager.find_cached_prefix(Request("probe", None, prompt, SamplingParams()).seqs[0])
    config = KVTransferConfig(kv_role="kv_consumer", kv_port=producer.engine.kv_connector.port,
                              kv_transport="socket", kv_key=KEY)
    consumer = KVConnector(config, [KVShard(torch.zeros_like(source))])
    consumer.receive(transfer, 1, [7, 3, 9])  # blocks 1..3; block 0 as if cached on this side
    assert len(full) == 4 and torch.equal(consumer.shards[0].pool[:, :, [7, 3, 9]], source[:, :, full[1:4]])
    assert consumer.shards[0].pool[:, :, [7, 3, 9]].abs().sum() > 0 and consumer.blocks_received == 3
    assert_all_free(producer)


def test_blocks_are_copied_run_by_run_to_their_places():
    """copy_blocks gives what indexing gives, for ids in runs on both sides, on one side, or none."""
    source = torch.randn(2, 3, 40, 2, 4, 8)
    src_ids, dst_ids = [5, 6, 7, 8, 20, 21, 30, 2, 3], [10, 11, 12, 13, 0, 1, 2, 3, 39]
    expected = torch.zeros_like(source)
    expected[:, :, dst_ids] = source[:, :, src_ids]
    pool = torch.zeros_like(source)
    copy_blocks(pool, dst_ids, source, src_ids)
    assert torch.equal(pool, expected)


def test_failed_transfers_free_every_block_and_say_why(tiny_llama, producer, consumer):
    prompt = list(range(30, 70))
    bogus = {"transfer_id": "no-such-transfer", "num_tokens": len(prompt), "token_hash": token_hash(prompt)}
    out = decode(consumer, [prompt], [bogus])[0]  # refused: the decode side computes the prompt itself
    assert out.error is None and len(out.outputs[0].token_ids) == 8
    assert consumer.engine.kv_connector.failed_pulls == 1
    assert_all_free(consumer)

    transfer = prefill(producer, [prompt])
    ask = {"key": "guess", "transfer_id": transfer[0]["transfer_id"], "first_block": 0, "count": 2, "transport": "shm"}
    assert pull(producer, ask) == {"ok": False, "error": "wrong kv key"}
    assert producer.engine.kv_connector.num_held_blocks() == 3  # a refused pull leaves the hold
    with pytest.raises(ValueError, match="not the one the prefill instance computed"):
        decode(consumer, [prompt[:-1]], transfer)
    assert decode(consumer, [prompt], transfer)[0].error is None  # the right consumer still can
    with pytest.raises(ValueError, match="not a prefill or decode instance"):
        LLM(str(tiny_llama), num_kv_blocks=8).generate([prompt], SamplingParams(kv_transfer_params={}), use_tqdm=False)

    # a consumer that dies in the middle of a pull (never says done): the producer lets go
    transfer = prefill(producer, [prompt])
    assert pull(producer, {**ask, "key": KEY, "transfer_id": transfer[0]["transfer_id"]})["ok"]
    connector = producer.engine.kv_connector
    connector.config.hold_timeout_s = 0.01
    prefill(producer, [[1, 2, 3]])  # never pulled: the hold expires
    time.sleep(0.05)
    assert_all_free(producer, consumer)
    connector.config.hold_timeout_s = 30.0


@pytest.fixture
def silent_producer():
    """A KV port that takes pulls and answers none: they fail when it closes their connections: a prefill
    instance busy with long prompts, or a hung one."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(30)  # a pull that never comes fails the test instead of hanging it
    yield listener
    listener.close()


def test_steps_go_on_while_a_pull_waits_and_an_abort_frees_its_blocks_after_it(tiny_llama, silent_producer):
    port = silent_producer.getsockname()[1]
    consumer = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=64,
                   kv_transfer_config={"kv_role": "kv_consumer", "kv_port": port, "kv_key": KEY})
    engine = consumer.engine
    waiting_pull = list(range(30, 70))
    aborted = list(range(200, 260))

    def transfer(prompt: list[int]) -> SamplingParams:
        params = {"transfer_id": "t", "num_tokens": len(prompt), "token_hash": token_hash(prompt)}
        return SamplingParams(**GREEDY, kv_transfer_params=params)

    engine.add_request("local", PROMPTS[3], SamplingParams(**GREEDY))
    engine.add_request("pulled", waiting_pull, transfer(waiting_pull))
    engine.add_request("aborted", aborted, transfer(aborted))
    for _ in range(4):
        engine.step()
    # the local request decoded while both pulls waited for an answer, outside the batch
    assert len(engine.requests["local"].seqs[0].output_token_ids) == 4
    assert engine.get_stats().num_waiting == 2 and engine.get_stats().num_running == 1
    engine.abort_request("aborted")
    engine.step()
    assert engine.get_stats().num_waiting == 1
    in_use = engine.get_stats().num_total_blocks - engine.get_stats().num_free_blocks
    live = {b for rid in ("local", "pulled") for b in engine.requests[rid].seqs[0].block_table}
    assert in_use == len(live) + -(-(len(aborted) - 1) // BS)  # the aborted one's wait for its pull to end

    for _ in range(2):  # the pulls go one after the other; each fails as its connection closes
        silent_producer.accept()[0].close()
    outs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs[out.request_id] = out
    assert outs["pulled"].error is None and len(outs["pulled"].outputs[0].token_ids) == 8  # computed here
    assert engine.kv_connector.failed_pulls == 2
    assert_all_free(consumer)
    engine.shutdown()


def test_a_killed_producers_pool_file_is_swept_and_live_ones_stay(producer):
    """SIGKILL (as `ray.kill` sends) skips a producer's cleanup and leaves its pool file in /dev/shm;
    the next sweep (a producer starting, the launcher or Ray driver stopping its servers) removes
    it, and never a live producer's file, in another process or this one."""
    child = subprocess.Popen([sys.executable, "-c", "import time; from llm_engine.kv_pool_files import new_pool_file; "
                              "print(new_pool_file(), flush=True); time.sleep(120)"],
                             stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert child.stdout is not None
        left = Path(child.stdout.readline().strip())
        assert left.name.startswith(f"codeyard-kv-{child.pid}-") and left.exists()
        assert left not in sweep_dead_pools()
        assert left.exists()
    finally:
        child.kill()
        child.wait()
    assert left.exists()
    assert left in sweep_dead_pools()
    assert not left.exists()
    ours = producer.engine.kv_connector.shards[0].path
    assert ours is not None and ours.exists()


def test_a_consumer_maps_only_its_current_producers_pool(tiny_llama, producer):
    """A restarted prefill instance has a new pool file: the decode side drops its mapping of the
    old one (which would keep that whole pool in memory) when it first pulls from the new one."""
    def mappings(path: Path) -> int:
        return Path("/proc/self/maps").read_text().count(str(path))

    old_path = producer.engine.kv_connector.shards[0].path
    consumer = KVConnector(KVTransferConfig(kv_role="kv_consumer", kv_port=producer.engine.kv_connector.port,
                                            kv_key=KEY), [KVShard(torch.zeros_like(producer.engine.kv_connector.shards[0].pool))])
    own = mappings(old_path)  # the producer's, in this process too
    consumer.receive(prefill(producer, [PROMPTS[3]])[0], 0, [1, 2, 3, 4, 5])
    assert mappings(old_path) == own + 1
    restarted = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=64,
                    kv_transfer_config={"kv_role": "kv_producer", "kv_key": KEY})
    try:
        consumer.config.kv_port = restarted.engine.kv_connector.port  # the same address, in real life
        transfer = prefill(restarted, [PROMPTS[3]])[0]
        consumer.receive(transfer, 0, [1, 2, 3, 4, 5])
        assert mappings(old_path) == own
        assert mappings(restarted.engine.kv_connector.shards[0].path) == 2  # its own and the consumer's
    finally:
        restarted.engine.shutdown()
    assert_all_free(producer)
