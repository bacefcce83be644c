"""The inline-latency benchmark's options, without loading a model."""

import pytest

from benchmarks.llm_inline_latency import parse_args


def test_defaults_are_the_assistants_suggestion():
    args = parse_args([])
    assert (args.tokens, args.threads) == (16, 1)


@pytest.mark.parametrize("argv", [["--tokens", "0"], ["--threads", "0"], ["--tokens", "x"]])
def test_bad_options_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
    assert "error:" in capsys.readouterr().err
