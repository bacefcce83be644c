"""A lesson project holding a file name the files API shows escaped (not UTF-8, a newline): checking
the lesson reads the learner's other files and leaves that one out, instead of failing (issue 14 sweep)."""

from __future__ import annotations

import os

from tutorials.checking import learner_files


def test_names_shown_escaped_are_not_part_of_the_answer(tmp_path):
    (tmp_path / "main.py").write_text("print('hi')\n")
    for raw in (b"bad\xffname.py", b"new\nline.py"):
        with open(os.path.join(os.fsencode(tmp_path), raw), "wb") as f:
            f.write(b"print('stray')\n")
    assert learner_files(tmp_path, {"main.py"}) == {"main.py": "print('hi')\n"}
