"""The autotuner's disk cache on the CPU: a miss times every candidate and saves the fastest, a hit
(in this process or the next) runs nothing, a corrupt file or an unwritable folder only costs a
new tuning. Candidates are plain callables that advance the clock the tuner reads by their cost
(real sleeps were reordered by scheduling delays on a loaded machine)."""

from __future__ import annotations

import json

import pytest
import torch

from llm_engine.kernels import autotune
from llm_engine.kernels.autotune import Autotuner, shape_bucket

CPU = torch.device("cpu")
CANDIDATES = [{"BLOCK": 16}, {"BLOCK": 32}, {"BLOCK": 64}]
SLEEP = {16: 0.004, 32: 0.0, 64: 0.002}  # BLOCK=32 is the fastest


class Clock:
    """The tuner's `time.perf_counter`: only the candidates' launches move it."""

    now = 0.0

    def perf_counter(self) -> float:
        return self.now


CLOCK = Clock()


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CODEYARD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "time", CLOCK)
    return tmp_path


class Launches:
    """A kernel stand-in that costs SLEEP[BLOCK] seconds on the tuner's clock and counts its launches."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, config: dict[str, int]) -> None:
        self.count += 1
        CLOCK.now += SLEEP[config["BLOCK"]]


def tuner() -> Autotuner:
    return Autotuner("demo_kernel", CANDIDATES, tuned_devices=("cpu",))


def test_a_miss_times_every_candidate_and_saves_the_fastest(cache_dir):
    run = Launches()
    assert tuner().pick((128, "bf16"), run, CPU) == {"BLOCK": 32}
    assert run.count == 3 * 6  # one warm-up and five timed launches each
    saved = json.loads((cache_dir / "autotune" / "cpu" / "demo_kernel.json").read_text())
    assert saved["choices"] == {"128|bf16": {"BLOCK": 32}}


def test_a_hit_runs_nothing_in_this_process_or_the_next():
    first = tuner()
    first.pick((128,), Launches(), CPU)
    again = Launches()
    assert first.pick((128,), again, CPU) == {"BLOCK": 32}
    assert tuner().pick((128,), again, CPU) == {"BLOCK": 32}  # a new process reads the file
    assert again.count == 0
    other_key = Launches()
    tuner().pick((256,), other_key, CPU)
    assert other_key.count > 0


def test_choices_of_another_key_are_kept_when_a_second_tuner_saves(cache_dir):
    tuner().pick((1,), Launches(), CPU)
    tuner().pick((2,), Launches(), CPU)
    saved = json.loads((cache_dir / "autotune" / "cpu" / "demo_kernel.json").read_text())
    assert set(saved["choices"]) == {"1", "2"}


@pytest.mark.parametrize("content", ["{not json", '["a list"]', '{"triton": "0.0", "choices": {"7": {"BLOCK": 64}}}',
                                     '{"choices": 3}'])
def test_a_corrupt_or_stale_file_is_tuned_again_and_rewritten(cache_dir, content):
    path = cache_dir / "autotune" / "cpu" / "demo_kernel.json"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    run = Launches()
    assert tuner().pick((7,), run, CPU) == {"BLOCK": 32}
    assert run.count > 0
    assert json.loads(path.read_text())["choices"] == {"7": {"BLOCK": 32}}


def test_a_saved_config_no_longer_among_the_candidates_is_tuned_again():
    tuner().pick((5,), Launches(), CPU)
    narrower = Autotuner("demo_kernel", [{"BLOCK": 64}, {"BLOCK": 16}], tuned_devices=("cpu",))
    run = Launches()
    assert narrower.pick((5,), run, CPU) == {"BLOCK": 64}
    assert run.count > 0


def test_an_unwritable_folder_only_logs_and_keeps_the_choice_in_memory(cache_dir, monkeypatch, caplog):
    blocker = cache_dir / "a-file"  # a folder cannot be made under a file, even by root
    blocker.write_text("")
    monkeypatch.setenv("CODEYARD_CACHE_DIR", str(blocker / "cache"))
    first = tuner()
    assert first.pick((9,), Launches(), CPU) == {"BLOCK": 32}
    assert "not saved" in caplog.text
    again = Launches()
    assert first.pick((9,), again, CPU) == {"BLOCK": 32}
    assert again.count == 0


def test_failing_candidates_are_skipped_and_all_failing_is_an_error():
    def only_64(config: dict[str, int]) -> None:
        if config["BLOCK"] != 64:
            raise RuntimeError("out of shared memory")

    assert tuner().pick((3,), only_64, CPU) == {"BLOCK": 64}

    def none(config: dict[str, int]) -> None:
        raise RuntimeError("out of shared memory")

    with pytest.raises(RuntimeError, match="demo_kernel: no candidate config ran: out of shared memory"):
        tuner().pick((4,), none, CPU)


def test_untuned_devices_get_the_first_candidate_without_a_launch(cache_dir):
    run = Launches()
    assert Autotuner("demo_kernel", CANDIDATES).pick((1,), run, CPU) == {"BLOCK": 16}
    assert run.count == 0
    assert not (cache_dir / "autotune").exists()


def test_shape_buckets_are_powers_of_two():
    assert [shape_bucket(n) for n in (1, 2, 3, 4, 5, 64, 65, 2048)] == [1, 2, 4, 4, 8, 64, 128, 2048]
    with pytest.raises(ValueError, match="at least one candidate"):
        Autotuner("empty", [])
