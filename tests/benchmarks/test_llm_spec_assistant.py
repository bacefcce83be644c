"""The assistant prompt-lookup benchmark's prompts and options, without loading a model."""

import pytest

from benchmarks.llm_spec_assistant import CUTS, cursor_prompts, parse_args


def test_prompts_put_the_cursor_after_a_line_s_indentation_and_mid_line_with_another_file_open():
    found = cursor_prompts(2)
    assert len(found) == 2 * len(CUTS) * 2
    at_line_start, mid_line = found[0::2], found[1::2]
    assert all(p.startswith("# file: other.py\n") and "\n# file: main.py\n" in p for p in found)
    assert all(not p.rsplit("\n", 1)[-1].strip() for p in at_line_start)  # only indentation before the cursor
    assert all(p.rsplit("\n", 1)[-1].strip() for p in mid_line)
    assert len(set(found)) == len(found)


@pytest.mark.parametrize("argv", [["--tokens", "0"], ["--threads", "0"], ["--files", "9"], ["--files", "x"]])
def test_bad_options_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
    assert "error:" in capsys.readouterr().err
