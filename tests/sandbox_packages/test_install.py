"""Real installs from PyPI through the install sandbox, then runs that import what was installed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from sandbox_fixtures import make_spec

from sandbox.backends.bwrap import BwrapBackend
from sandbox.packages.install import INSTALL_LIMITS, Installer, InstallFailed
from sandbox.packages.project import add_packages, installed_for, prepare_node, prepare_python


@pytest.fixture(scope="module")
def installer(packages_root) -> Installer:
    return Installer(BwrapBackend(), packages_root)


async def run_python(project: Path, prepared, code: str):
    (project / "main.py").write_text(code)
    spec = make_spec(project, ["python3", "main.py"])
    spec = type(spec)(spec.argv, spec.project_dir, spec.limits, prepared.env, mounts=prepared.mounts)
    return await BwrapBackend().run(spec)


async def test_import_six_installs_pins_and_is_cached(installer, project):
    (project / "main.py").write_text("import six\nprint(six.__version__)\n")
    said: list[str] = []
    prepared = await prepare_python(installer, project, said.append)
    assert "Successfully installed six-" in "".join(said)
    version = (project / "requirements.txt").read_text().strip().removeprefix("six==")
    assert version and version[0].isdigit(), (project / "requirements.txt").read_text()

    result = await run_python(project, prepared, "import six\nprint(six.__version__)\n")
    assert (result.verdict.value, result.stdout.decode().strip()) == ("ok", version), result.stderr

    again: list[str] = []  # now declared (pinned) in requirements.txt: the same environment, no install
    assert await prepare_python(installer, project, again.append) == prepared
    assert again == []


async def test_each_later_import_is_installed_and_appended_pinned(installer, project):
    (project / "requirements.txt").write_text("six\n")
    (project / "main.py").write_text("import six\nimport toml\n")
    said: list[str] = []
    prepared = await prepare_python(installer, project, said.append)
    assert "Your code uses 'toml' and requirements.txt does not list toml yet" in "".join(said)
    lines = (project / "requirements.txt").read_text().splitlines()
    assert [line.split("==")[0] for line in lines] == ["six", "toml"] and all("==" in line for line in lines), lines
    result = await run_python(project, prepared, "import six, toml\nprint(toml.dumps({'a': 1}), end='')\n")
    assert (result.verdict.value, result.stdout) == ("ok", b"a = 1\n"), result.stderr
    again: list[str] = []
    assert await prepare_python(installer, project, again.append) == prepared and again == []
    shell = installed_for(installer, project)  # the Shell: the same environment, found without installing
    assert (shell.mounts, shell.env) == (prepared.mounts, prepared.env)
    listed = await BwrapBackend().run(dataclasses.replace(make_spec(project, ["python3", "-m", "pip", "list"]),
                                                          env=shell.env, mounts=shell.mounts))
    assert b"toml " in listed.stdout and b"six " in listed.stdout, listed.stdout


async def test_with_auto_install_off_a_new_import_is_named_not_installed(installer, project):
    (project / "requirements.txt").write_text("six\n")
    (project / "codeyard.toml").write_text("[packages]\nauto_install = false\n")
    (project / "main.py").write_text("import six\nimport toml\n")
    prepared = await prepare_python(installer, project, lambda _: None)
    assert [Path(m.source).joinpath("toml").exists() for m in prepared.mounts] == [False]
    assert "'toml' needs the package toml" in prepared.notes[0] and "auto_install = false" in prepared.notes[0]
    assert (project / "requirements.txt").read_text().splitlines()[0].startswith("six==")
    assert len((project / "requirements.txt").read_text().splitlines()) == 1


async def test_the_install_button_adds_an_imported_package_the_file_lacks(installer, project):
    (project / "requirements.txt").write_text("six\n")
    (project / "main.py").write_text("import toml\n")
    await add_packages(installer, project, ["toml"])
    lines = (project / "requirements.txt").read_text().splitlines()
    assert [line.split("==")[0] for line in lines] == ["six", "toml"] and all("==" in line for line in lines), lines


async def test_runs_cannot_change_the_environment(installer, project):
    (project / "requirements.txt").write_text("six\n")
    prepared = await prepare_python(installer, project, lambda _: None)
    result = await run_python(project, prepared, "import six, pathlib\npathlib.Path(six.__file__).write_text('x')\n")
    assert result.verdict.value == "runtime_error"
    assert b"Read-only file system" in result.stderr
    assert Path(prepared.mounts[0].source, "six.py").read_text() != "x"


async def test_unknown_imports_are_reported_and_nothing_installed(installer, project):
    (project / "main.py").write_text("import reqeusts\nimport os\n")
    prepared = await prepare_python(installer, project, lambda _: pytest.fail("nothing to install"))
    assert prepared.unknown == ("reqeusts",) and prepared.mounts == ()
    assert not (project / "requirements.txt").exists()


async def test_a_failed_install_says_why(installer, project):
    (project / "requirements.txt").write_text("codeyard-no-such-package-4f1e2\n")
    with pytest.raises(InstallFailed, match="codeyard-no-such-package-4f1e2"):
        await prepare_python(installer, project, lambda _: None)
    assert list(installer.envs.glob(".staging-*")) == []


async def test_a_packages_folder_the_server_cannot_manage_is_a_clear_failure(packages_root):
    broken = Installer(BwrapBackend(), packages_root / "broken")
    broken.envs.rmdir()
    broken.envs.write_text("not a folder")  # where the install's staging folder would go
    with pytest.raises(InstallFailed, match="failed on the server: its packages folder could not be managed"):
        await broken.install(["six"])


async def test_an_environment_past_the_quota_is_refused_whole(packages_root, project):
    small = Installer(BwrapBackend(), packages_root / "small", limits=dataclasses.replace(INSTALL_LIMITS, files_count=3))
    with pytest.raises(InstallFailed, match="past the quota of 3 files"):
        await small.install(["six"])
    assert small.cached(["six"]) is None and list(small.envs.glob(".staging-*")) == []


async def test_node_require_installs_with_npm_and_is_cached(installer, project):
    (project / "index.js").write_text("const ms = require('ms');\nconsole.log(ms('2h'));\n")
    said: list[str] = []
    prepared = await prepare_node(installer, project, said.append)
    assert "added 1 package" in "".join(said), said
    spec = make_spec(project, ["node", "./index.js"])
    result = await BwrapBackend().run(dataclasses.replace(spec, mounts=prepared.mounts))
    assert (result.verdict.value, result.stdout) == ("ok", b"7200000\n"), result.stderr
    declared = json.loads((project / "package.json").read_text())["dependencies"]
    assert list(declared) == ["ms"] and declared["ms"][0].isdigit(), declared  # pinned, so later runs find it
    again: list[str] = []
    assert await prepare_node(installer, project, again.append) == prepared and again == []
    (project / "index.js").write_text("require('ms'); const { Command } = require('commander');\nconsole.log(typeof Command);\n")
    said.clear()  # a later require is installed too, and pinned beside the first
    prepared = await prepare_node(installer, project, said.append)
    assert "Your code uses 'commander' and package.json does not list commander yet" in "".join(said)
    assert sorted(json.loads((project / "package.json").read_text())["dependencies"]) == ["commander", "ms"]
    result = await BwrapBackend().run(dataclasses.replace(spec, mounts=prepared.mounts))
    assert (result.verdict.value, result.stdout) == ("ok", b"function\n"), result.stderr
