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
