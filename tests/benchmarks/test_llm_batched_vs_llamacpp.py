"""The batched llama.cpp anchor's finder and options, without building or running anything."""

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


@pytest.mark.parametrize("argv", [["--npl", "1,x"], ["--rows", "int3"], ["--ntg", "1"], ["--npl", "0,4"]])
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
