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
