"""Languages: each runs for real on both backends; codeyard.toml [run] chooses command, entry and limits."""

from __future__ import annotations

import pytest

from sandbox.backend import RunSpec
from sandbox.languages import plan_run
from sandbox.limits import SERVER_MAXIMA, Limits
from sandbox.verdict import Verdict

PROGRAMS = {
    "main.py": "name = input()\nprint(f'py {name} {sum(range(10))}')\n",
    "index.js": "const lines = require('fs').readFileSync(0, 'utf8').trim();\nconsole.log(`js ${lines} ${[1,2,3].reduce((a,b)=>a+b)}`);\n",
    "main.sh": "read name\necho \"sh $name $((20 + 25))\"\n",
    "main.c": "#include <stdio.h>\n#include <math.h>\nint main(void){char s[64];scanf(\"%63s\", s);printf(\"c %s %d\\n\", s, (int)sqrt(2025.0));return 0;}\n",
    "main.cpp": "#include <iostream>\n#include <vector>\nint main(){std::string s;std::cin>>s;std::vector<int> v{1,2,3};std::cout<<\"cpp \"<<s<<\" \"<<v.size()<<\"\\n\";}\n",
}
EXPECTED = {"main.py": "py ada 45", "index.js": "js ada 6", "main.sh": "sh ada 45", "main.c": "c ada 45", "main.cpp": "cpp ada 3"}


@pytest.mark.parametrize("entry", list(PROGRAMS))
async def test_language_runs_with_input(backend, project, entry):
    (project / entry).write_text(PROGRAMS[entry])
    plan = plan_run(project)
    result = await backend.run(RunSpec(plan.argv, project, plan.limits), stdin=b"ada\n")
    assert result.verdict == Verdict.OK, result
    assert result.stdout.decode().strip() == EXPECTED[entry]
    assert result.files_written == []  # compiled binaries stay in /tmp


async def test_compile_error_is_a_runtime_error_with_the_compiler_message(backend, project):
    (project / "main.c").write_text("int main(void) { return undefined_name; }\n")
    plan = plan_run(project)
    result = await backend.run(RunSpec(plan.argv, project, plan.limits))
    assert result.verdict == Verdict.RUNTIME_ERROR and b"undefined_name" in result.stderr


async def test_toml_command_and_limits(backend, project):
    (project / "tool.py").write_text("import sys\nprint(sys.argv[1:])\n")
    (project / "codeyard.toml").write_text('[run]\ncommand = ["python3", "tool.py", "a b", "--x"]\n[run.limits]\nwall_seconds = 999\ncpu_seconds = 1\n')
    plan = plan_run(project)
    assert plan.limits.wall_seconds == SERVER_MAXIMA.wall_seconds and plan.limits.cpu_seconds == 1
    result = await backend.run(RunSpec(plan.argv, project, plan.limits))
    assert result.stdout == b"['a b', '--x']\n"


def test_entry_choice(project):
    (project / "main.py").write_text("")
    (project / "other.js").write_text("")
    (project / "-rf.py").write_text("")
    assert plan_run(project).argv == ["python3", "./main.py"]
    assert plan_run(project, "other.js").argv == ["node", "./other.js"]
    assert plan_run(project, "-rf.py").argv == ["python3", "./-rf.py"]
    (project / "codeyard.toml").write_text('[run]\nentry = "other.js"\n')
    assert plan_run(project).language == "javascript"


@pytest.mark.parametrize(
    ("files", "entry", "message"),
    [
        ({}, None, "entry: no entry file"),
        ({"a.rb": ""}, "a.rb", "entry: cannot tell how to run"),
        ({"main.py": ""}, "../etc/passwd", "entry: .* relative path inside the project"),
        ({"main.py": ""}, "missing.py", "entry: 'missing.py' does not exist"),
        ({"codeyard.toml": "[run\n"}, None, "codeyard.toml"),
        ({"codeyard.toml": "[run]\ncommand = []\n"}, None, "run.command must be a non-empty list"),
        ({"codeyard.toml": "[run]\ncommand = 'x'\n[run.limits]\nram = 5\n"}, None, "limits.ram is not a known limit"),
        ({"codeyard.toml": "[run]\ncommand = 'x'\n[run.limits]\ncpu_seconds = 'lots'\n"}, None, "limits.cpu_seconds must be a number"),
        ({"codeyard.toml": "[run]\ncommand = 'x'\n[run.limits]\npids = -1\n"}, None, "limits.pids must be a positive number"),
    ],
)
def test_bad_configuration_names_the_field(project, files, entry, message):
    for name, text in files.items():
        (project / name).write_text(text)
    with pytest.raises(ValueError, match=message):
        plan_run(project, entry)


def test_symlinked_entry_is_refused(project, tmp_path):
    (tmp_path / "elsewhere.py").write_text("")
    (project / "main.py").symlink_to(tmp_path / "elsewhere.py")
    with pytest.raises(ValueError, match="not a regular file"):
        plan_run(project, "main.py")


def test_limits_clamp_to_server_maxima():
    asked = Limits(cpu_seconds=1000, memory_bytes=1 << 40, pids=3)
    clamped = asked.clamp(SERVER_MAXIMA)
    assert clamped.cpu_seconds == SERVER_MAXIMA.cpu_seconds and clamped.memory_bytes == SERVER_MAXIMA.memory_bytes
    assert clamped.pids == 3
