"""KVConnector.close leaves no thread that could free a pool tensor at exit. A daemon thread whose
target (the connector's bound method, or its server's) held the last reference to the pools freed
a tensor while the interpreter finalized; the tensor's dealloc releases the GIL, taking it back
then ends the thread inside torch's C++ frame, and the process aborted with "terminate called
without an active exception" (a core dump of a disaggregated instance's engine core showed it)."""

from __future__ import annotations

import threading
import time

import torch

from llm_engine.kv_connector import KVConnector, KVShard, KVTransferConfig


def alive(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


def test_close_waits_for_a_pull_under_way_and_lets_go_of_the_pools(monkeypatch) -> None:
    started = threading.Event()

    def slow_receive(self, params, first_block, dst_block_ids, shards=None) -> None:
        started.set()
        time.sleep(0.5)

    monkeypatch.setattr(KVConnector, "receive", slow_receive)
    config = KVTransferConfig(kv_role="kv_consumer", kv_port=9, kv_transport="socket", kv_key="k")
    connector = KVConnector(config, [KVShard(torch.zeros(2, 1, 4, 1, 2, 2))])
    connector.start_load(1, {"transfer_id": "x"}, 0, [0])
    assert started.wait(10)
    connector.close()
    assert not alive("kv-loads")
    assert connector.finished_loads() == [(1, None)]
    assert connector.shards == []


def test_a_producers_close_ends_its_server_thread_and_lets_go_of_the_pools() -> None:
    config = KVTransferConfig(kv_role="kv_producer", kv_transport="socket", kv_key="k")
    connector = KVConnector(config, [KVShard(torch.zeros(2, 1, 4, 1, 2, 2))])
    assert alive("kv-connector")
    connector.close()
    assert not alive("kv-connector")
    assert connector.shards == []
