"""The batched llama.cpp anchor's finder and options, without building or running anything."""

import time

import pytest

from benchmarks.llm_batched_vs_llamacpp import LLAMA_CPP_PYTHON, LlamaCppMissing, find_batched_bench, parse_args


def test_missing_tool_says_how_to_build_it(tmp_path):
    with pytest.raises(LlamaCppMissing) as missing:
        find_batched_bench(tmp_path)
    message = str(missing.value)
    assert str(tmp_path / "bin" / "llama-batched-bench") in message
    assert "--build-llamacpp" in message and f"llama-cpp-python=={LLAMA_CPP_PYTHON}" in message


def test_built_tool_is_found(tmp_path):
    binary = tmp_path / "bin" / "llama-batched-bench"
    binary.parent.mkdir()
    binary.write_text("")
    assert find_batched_bench(tmp_path) == binary


@pytest.mark.parametrize("argv", [["--npl", "1,x"], ["--rows", "int3"], ["--ntg", "1"], ["--npl", "0,4"], ["--rounds", "-1"]])
def test_bad_options_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_each_batch_size_runs_the_tool_once_and_reads_its_jsonl(tmp_path):
    from benchmarks.llm_batched_vs_llamacpp import llamacpp_batched

    tool = tmp_path / "llama-batched-bench"  # answers as the real tool does: one jsonl line on stdout
    tool.write_text('#!/bin/sh\ncase " $* " in *" --no-repack "*) ;; *) exit 3 ;; esac\n'
                    'while [ "$1" != "-npl" ]; do shift; done\n'
                    'echo "{\\"pl\\": $2, \\"t\\": 2.0, \\"speed_tg\\": 10.0, \\"speed_pp\\": 20.0}"\n')
    tool.chmod(0o755)
    figures = llamacpp_batched(tool, tmp_path / "model.gguf", npp=8, ntg=5, npl=[1, 4], threads=1)
    assert sorted(figures) == [1, 4]
    assert figures[4]["output_tok_s"] == 4 * 5 / 2.0 and figures[4]["decode_tok_s"] == 10.0
    assert figures[1]["prefill_tok_s"] == 20.0 and figures[1]["cpu_seconds"] >= 0


def test_no_tool_and_no_bindings_stops_with_what_to_do(monkeypatch):
    import importlib.util

    from benchmarks import llm_batched_vs_llamacpp as bench

    def missing(*_):
        raise LlamaCppMissing("llama-batched-bench is not built")

    real = importlib.util.find_spec
    monkeypatch.setattr(bench, "find_batched_bench", missing)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    with pytest.raises(SystemExit) as exit_:
        bench.run(parse_args(["--npl", "1"]))
    assert "CODEYARD_LLAMACPP_BUILD" in str(exit_.value.code) and "--llamacpp none" in str(exit_.value.code)


class _FakeEngine:
    """An engine whose steps schedule the given (sequence, new tokens) lists and burn CPU."""

    def __init__(self, steps):
        from types import SimpleNamespace

        self.steps = list(steps)
        self.model_runner = SimpleNamespace(execute=lambda scheduled, copies: None)

    def step(self):
        scheduled = self.steps.pop(0)
        sum(i * i for i in range(20_000))  # some CPU in every step
        self.model_runner.execute(scheduled, [])


def test_decode_phase_counts_only_steps_where_every_sequence_decodes_one_token():
    from types import SimpleNamespace

    from benchmarks.llm_batched_vs_llamacpp import DecodePhase

    engine = _FakeEngine([[("a", 64), ("b", 64)], [("a", 1), ("b", 64)], [("a", 1), ("b", 1)], [("a", 1), ("b", 1)],
                          [("a", 1)]])
    phase = DecodePhase(SimpleNamespace(engine=engine))
    engine.step()  # prefill: not counted
    engine.step()  # a decode beside a prefill: not counted
    assert phase.tokens == 0 and phase.cpu_seconds == 0
    engine.step()
    engine.step()
    engine.step()
    assert phase.tokens == 5 and phase.cpu_seconds > 0
    assert phase.tok_per_cpu_s() == 5 / phase.cpu_seconds
    phase.clear()
    assert phase.tokens == 0 and phase.tok_per_cpu_s() != phase.tok_per_cpu_s()  # nan: nothing measured


def test_int4_vs_bf16_ratios_per_batch_size_total_and_decode(capsys):
    from benchmarks.llm_batched_vs_llamacpp import print_ratios, ratios_by_batch

    def row(output, output_cpu, decode, decode_cpu):
        return {"output_tok_s": output, "output_tok_per_cpu_s": output_cpu, "decode_tok_s": decode,
                "decode_tok_per_cpu_s": decode_cpu}

    int4 = {8: row(100, 110, 200, 260), 64: row(300, 330, 500, 700), 16: row(1, 1, 1, 1)}
    bf16 = {8: row(100, 100, 100, 200), 64: row(200, 300, 500, 500)}
    ratios = ratios_by_batch(int4, bf16)
    assert sorted(ratios) == [8, 64]  # B=16 has no bf16 run
    assert ratios[8] == {"output_tok_s": 1.0, "output_tok_per_cpu_s": 1.1, "decode_tok_s": 2.0,
                         "decode_tok_per_cpu_s": 1.3}
    assert ratios[64]["output_tok_s"] == 1.5 and ratios[64]["decode_tok_per_cpu_s"] == 1.4
    print_ratios("int4", ratios, 1.3)
    lines = capsys.readouterr().out.splitlines()
    b8 = next(line for line in lines if line.split() and line.split()[0] == "8")
    assert b8.split() == ["8", "1.00x", "1.10x", "2.00x*", "1.30x*"]
    assert any(line.startswith("int4 vs bf16 per batch size") for line in lines)
    print_ratios("w4a8", ratios, 1.3, "f32")  # an AVX2 host's reference: float32, its auto dtype
    assert any(line.startswith("w4a8 vs f32 per batch size") for line in capsys.readouterr().out.splitlines())


def _rounds(values):
    """Per-round figures at B=64 with every RATIO_FIGURES figure set to `value`."""
    from benchmarks.llm_batched_vs_llamacpp import RATIO_FIGURES

    return [{64: {key: v for _, key in RATIO_FIGURES}} for v in values]


def test_rounds_judge_the_per_round_ratios_against_the_goal():
    from benchmarks.llm_batched_vs_llamacpp import judge_rounds

    bf16 = _rounds([100, 200, 100, 300, 100, 100, 200])  # the host's speed drifts from round to round
    met = judge_rounds(_rounds([140, 290, 135, 420, 150, 131, 270]), bf16)[64]["output_tok_per_cpu_s"]
    assert met["verdict"] == "met" and met["low"] >= 1.3 and met["confidence"] >= 0.9
    assert met["ratios"] == [1.4, 1.45, 1.35, 1.4, 1.5, 1.31, 1.35] and met["median"] == 1.4
    # the same medians of the rows' own figures, but the ratios within rounds spread across the goal
    spread = judge_rounds(_rounds([100, 400, 160, 300, 100, 110, 300]), bf16)[64]["output_tok_per_cpu_s"]
    assert spread["verdict"] == "undecided" and spread["low"] < 1.3 < spread["high"]
    missed = judge_rounds(_rounds([100, 210, 95, 330, 105, 110, 200]), bf16)[64]["decode_tok_per_cpu_s"]
    assert missed["verdict"] == "not met" and missed["high"] < 1.3


def test_too_few_rounds_are_undecided_however_clear():
    from benchmarks.llm_batched_vs_llamacpp import judge_rounds

    judged = judge_rounds(_rounds([200, 200, 200, 200]), _rounds([100, 100, 100, 100]))[64]["output_tok_s"]
    assert judged["median"] == 2.0 and judged["confidence"] < 0.9 and judged["verdict"] == "undecided"


def test_rounds_print_each_figure_with_its_interval_and_verdict(capsys):
    from benchmarks.llm_batched_vs_llamacpp import judge_rounds, print_judged

    judged = judge_rounds(_rounds([150, 140, 160, 150, 145]), _rounds([100] * 5))
    print_judged("int4", "bf16", judged, 5)
    out = capsys.readouterr().out
    assert "int4 vs bf16 over 5 paired rounds" in out
    line = next(line for line in out.splitlines() if line.split() and line.split()[0] == "64")
    assert line.split()[1:4] == ["1.50x", "[1.40-1.60]", "*"]


class _FakeLLM:
    """generate() as the engine answers it: one prompt step, then decode steps, `ntg` tokens each."""

    def __init__(self, name, calls):
        from types import SimpleNamespace

        self.name, self.calls = name, calls
        self.engine = SimpleNamespace(model_runner=SimpleNamespace(execute=lambda scheduled, copies: None))
        self.engine.step = self._step

    def _step(self, scheduled):
        sum(i * i for i in range(2_000))
        self.engine.model_runner.execute(scheduled, [])

    def generate(self, batch, params, use_tqdm=False):
        from types import SimpleNamespace

        self.calls.append((self.name, len(batch), batch[0][:3]))
        self.engine.step([(i, len(p)) for i, p in enumerate(batch)])
        for _ in range(params.max_tokens - 1):
            self.engine.step([(i, 1) for i in range(len(batch))])
        now = time.perf_counter()
        metrics = SimpleNamespace(arrival_time=now - 0.2, first_token_time=now - 0.1, finished_time=now)
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[0] * params.max_tokens)], metrics=metrics)
                for _ in batch]


def test_paired_rounds_alternate_the_rows_on_the_same_prompts():
    from benchmarks.llm_batched_vs_llamacpp import median_figures, paired_rounds

    calls = []
    llms = {"int4": _FakeLLM("int4", calls), "bf16": _FakeLLM("bf16", calls)}
    rounds = paired_rounds(llms, npp=4, ntg=3, npl=[2, 8], rounds=3)
    assert [(row, b) for row, b, _ in calls] == [("int4", 2), ("int4", 8), ("bf16", 2), ("bf16", 8),
                                                 ("bf16", 2), ("bf16", 8), ("int4", 2), ("int4", 8),
                                                 ("int4", 2), ("int4", 8), ("bf16", 2), ("bf16", 8)]
    prompts_of = [p for _, _, p in calls]
    assert prompts_of[0] == prompts_of[2] and prompts_of[5] == prompts_of[7]  # a round's rows: the same prompts
    assert prompts_of[0] != prompts_of[4]  # a new round: new prompts
    assert len(rounds["int4"]) == 3 and sorted(rounds["int4"][0]) == [2, 8]
    figures = rounds["bf16"][1][8]
    assert figures["decode_tok_per_cpu_s"] > 0 and figures["output_tok_s"] > 0
    assert median_figures(rounds["int4"])[8]["cpu_seconds"] == sorted(r[8]["cpu_seconds"] for r in rounds["int4"])[1]
