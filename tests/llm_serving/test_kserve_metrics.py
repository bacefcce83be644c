"""Triton's nv_inference_* metrics on /metrics move by exactly what each /v2 or gRPC request does."""

from __future__ import annotations

import json
import queue
import re
import threading
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from llm_engine.entrypoints.service import ServerOptions

from .conftest import TINY_NAME, serve_model
from .test_kserve_grpc import inputs as grpc_inputs
from .test_kserve_http import text_inputs

ENSEMBLE = "code-completion"
COUNTERS = ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count",
            "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
            "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
            "nv_inference_compute_output_duration_us")
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
_SAMPLE = re.compile(r'^(nv_[a-z_]+)\{model="([^"]*)",(?:reason="([A-Z]+)",)?version="1"\} (\d+)$')


def scrape(url: str) -> dict[tuple[str, str, str | None], int]:
    """Triton's samples on /metrics, by (name, model, reason)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    samples = {}
    for line in text.splitlines():
        if line.startswith("nv_"):
            match = _SAMPLE.match(line)
            assert match, line
            name, model, reason, value = match.groups()
            samples[(name, model, reason)] = int(value)
    return samples


class Counts:
    """One model's Triton counts, read before and after some requests."""

    def __init__(self, url: str, model: str = TINY_NAME) -> None:
        self.url, self.model = url, model
        self.before = self.read()

    def read(self) -> dict[str, int]:
        samples = scrape(self.url)
        values = {name: samples[(name, self.model, None)] for name in (*COUNTERS, "nv_inference_pending_request_count")}
        values |= {reason: samples[("nv_inference_request_failure", self.model, reason)] for reason in REASONS}
        return values

    def moved(self) -> dict[str, int]:
        """What changed since the first read (zero changes left out)."""
        after = self.read()
        return {k: after[k] - self.before[k] for k in after if after[k] != self.before[k]}


def counts_moved(moved: dict[str, int], success: int = 1, inferences: int = 1, executions: int = 1) -> None:
    """The counts a successful request moves, and durations that add up."""
    assert moved.pop("nv_inference_request_success") == success
    assert moved.pop("nv_inference_count") == inferences
    assert moved.pop("nv_inference_exec_count") == executions
    parts = sum(moved.pop(name, 0) for name in COUNTERS[4:])
    total = moved.pop("nv_inference_request_duration_us")
    assert total > 0 and abs(total - parts) <= 4 * success, (total, parts)  # each part rounded to 1 us
    assert moved == {}, moved  # no failure, nothing pending


@pytest.fixture
def http_triton(tiny_server):
    client = httpclient.InferenceServerClient(tiny_server.url.removeprefix("http://"), network_timeout=60)
    yield client
    client.close()


@pytest.fixture
def grpc_triton(tiny_server):
    client = grpcclient.InferenceServerClient(tiny_server.service.options.grpc_address)
    yield client
    client.close()


def test_names_types_and_labels_are_tritons(tiny_server):
    text = httpx.get(tiny_server.url + "/metrics", timeout=30).text
    for name in COUNTERS:
        assert f"# TYPE {name} counter\n" in text
    assert "# TYPE nv_inference_request_failure counter\n" in text
    assert "# TYPE nv_inference_pending_request_count gauge\n" in text
    assert "vllm:num_requests_running" in text  # the same /metrics
    samples = scrape(tiny_server.url)
    for model in (TINY_NAME, ENSEMBLE):  # every model exported from the start
        assert all((name, model, None) in samples for name in COUNTERS)
        assert all(("nv_inference_request_failure", model, reason) in samples for reason in REASONS)


def test_http_infer_batch_counts_rows_and_failures_name_a_reason(tiny_server, http_triton):
    counts = Counts(tiny_server.url)
    http_triton.infer(TINY_NAME, text_inputs(["a", "b", "c"], True, max_tokens=3, ignore_eos=True))
    counts_moved(counts.moved(), inferences=3)

    counts = Counts(tiny_server.url)
    with pytest.raises(InferenceServerException, match="temperature"):
        http_triton.infer(TINY_NAME, text_inputs(["a"], False, temperature=9.0))
    with pytest.raises(InferenceServerException, match="does not exist"):  # no model: not counted, no label
        http_triton.infer("nope", text_inputs(["a"], False))
    assert counts.moved() == {"OTHER": 1}
    assert not any(model == "nope" for _, model, _ in scrape(tiny_server.url))


def test_http_generate_and_generate_stream_count_one_request_each(tiny_server):
    url = f"{tiny_server.url}/v2/models/{TINY_NAME}"
    body = {"text_input": "Once upon", "max_tokens": 4, "ignore_eos": True}
    counts = Counts(tiny_server.url)
    assert httpx.post(url + "/generate", json=body, timeout=60).status_code == 200
    with httpx.stream("POST", url + "/generate_stream", json=body, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert len(events) > 1
    counts_moved(counts.moved(), success=2, inferences=2, executions=2)


def test_grpc_infer_stream_and_cancel(tiny_server, grpc_triton):
    counts = Counts(tiny_server.url)
    grpc_triton.infer(TINY_NAME, grpc_inputs(["a", "b", "c"], max_tokens=2, ignore_eos=True))
    counts_moved(counts.moved(), inferences=3)

    counts = Counts(tiny_server.url)
    responses: queue.Queue = queue.Queue()
    grpc_triton.start_stream(callback=lambda result, error: responses.put((result, error)))
    grpc_triton.async_stream_infer(TINY_NAME, grpc_inputs(["Once"], stream=True, max_tokens=5, ignore_eos=True))
    while not responses.get(timeout=60)[0].get_response().parameters["triton_final_response"].bool_param:
        pass
    grpc_triton.async_stream_infer(TINY_NAME, grpc_inputs(["a"], temperature=9.0))  # an error in-stream
    assert responses.get(timeout=60)[1] is not None
    grpc_triton.async_stream_infer(TINY_NAME, grpc_inputs(["go on"], stream=True, max_tokens=400, ignore_eos=True))
    responses.get(timeout=60)  # generating
    grpc_triton.stop_stream(cancel_requests=True)
    deadline = time.monotonic() + 10
    while "CANCELED" not in (moved := counts.moved()):
        assert time.monotonic() < deadline, moved
        time.sleep(0.05)
    assert moved.pop("OTHER") == 1 and moved.pop("CANCELED") == 1
    counts_moved(moved)


def test_ensemble_requests_count_under_the_ensemble(tiny_server, grpc_triton):
    llm, ensemble = Counts(tiny_server.url), Counts(tiny_server.url, ENSEMBLE)
    prefix = grpcclient.InferInput("prefix", [2, 1], "BYTES")
    prefix.set_data_from_numpy(np.array([[b"def f():"], [b"x = "]], dtype=object))
    grpc_triton.infer(ENSEMBLE, [prefix])
    counts_moved(ensemble.moved(), inferences=2)
    assert llm.moved() == {}


def test_pending_while_queued_rejected_when_full_canceled_when_left(tiny_chat_model):
    """One sequence at a time and one waiting: while a long stream runs, a second request is pending,
    a third is refused (REJECTED); leaving the stream cancels it (CANCELED), the second then runs."""
    running = serve_model(tiny_chat_model, "one-at-a-time", ServerOptions(max_waiting=1), max_num_seqs=1,
                          num_kv_blocks=256, max_model_len=4096)
    url = f"{running.url}/v2/models/one-at-a-time"
    counts = Counts(running.url, "one-at-a-time")
    answers: queue.Queue = queue.Queue()
    try:
        with httpx.stream("POST", url + "/generate_stream", timeout=60,
                          json={"text_input": "go on", "max_tokens": 4000, "ignore_eos": True}) as first:
            assert first.status_code == 200, first.read()
            lines = first.iter_lines()  # kept: a dropped iterator closes the response
            assert "text_output" in next(lines)  # it runs, and will run for long
            second = threading.Thread(target=lambda: answers.put(
                httpx.post(url + "/generate", json={"text_input": "b", "max_tokens": 1}, timeout=120).status_code))
            second.start()
            deadline = time.monotonic() + 30
            while (counts.moved().get("nv_inference_pending_request_count") != 1
                   or running.service.engine.num_waiting() != 1):
                assert time.monotonic() < deadline, "the second request never waited"
                time.sleep(0.05)
            assert httpx.post(url + "/generate", json={"text_input": "c"}, timeout=30).status_code == 429
            assert answers.empty()
        second.join(120)
        assert answers.get_nowait() == 200
        moved = counts.moved()
        assert moved.pop("REJECTED") == 1 and moved.pop("CANCELED") == 1
        counts_moved(moved)
    finally:
        running.stop()
