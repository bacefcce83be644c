"""The `codeyard` command line: --version, --help everywhere, admin create-user, clean errors, lazy sub-commands."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ide_server import __version__, cli

CODEYARD = Path(sys.executable).parent / "codeyard"


def run(*args: str, stdin: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    if not CODEYARD.exists():
        pytest.fail(f"{CODEYARD} is missing: install the package (make test does: pip install -e .)")
    return subprocess.run(
        [str(CODEYARD), *args], input=stdin, capture_output=True, text=True, timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_version():
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"codeyard {__version__}"


@pytest.mark.parametrize("command", [[], ["serve"], ["admin"], ["admin", "create-user"], ["admin", "set-password"]])
def test_help_everywhere(command):
    result = run(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage" in result.stdout


def test_create_user_then_sign_in(anon, settings):
    env = {"CODEYARD_DATABASE_URL": settings.database_url}
    result = run("admin", "create-user", "Carol", "--admin", "--password-stdin",
                 "--data-dir", str(settings.data_dir), stdin="carols-password\n", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "created user 'carol' (admin)"
    response = anon.post("/api/auth/login", json={"username": "carol", "password": "carols-password"})
    assert response.status_code == 200
    assert response.json()["user"]["is_admin"] is True

    again = run("admin", "create-user", "carol", "--password-stdin", "--data-dir", str(settings.data_dir),
                stdin="another-password\n", env=env)
    assert again.returncode == 2
    assert again.stderr == "codeyard: error: username 'carol' is taken\n"


def test_set_password_replaces_it_and_ends_sessions(app, anon, new_user, settings):
    dave = new_user()
    env = {"CODEYARD_DATABASE_URL": settings.database_url}
    result = run("admin", "set-password", dave.username, "--password-stdin", "--data-dir", str(settings.data_dir),
                 stdin="brand-new-password\n", env=env)
    assert result.returncode == 0, result.stderr
    assert dave.get("/api/me").status_code == 401  # signed out everywhere
    assert anon.post("/api/auth/login", json={"username": dave.username, "password": dave.password}).status_code == 401
    assert anon.post("/api/auth/login", json={"username": dave.username, "password": "brand-new-password"}).status_code == 200

    missing = run("admin", "set-password", "nobody-here", "--password-stdin", "--data-dir", str(settings.data_dir),
                  stdin="whatever-password\n", env=env)
    assert (missing.returncode, missing.stderr) == (2, "codeyard: error: no user named 'nobody-here'\n")


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["no-such-command"], {}, "No such command 'no-such-command'"),
        (["serve", "--port", "abc"], {}, "Invalid value for '--port'"),
        (["serve", "--port", "70000"], {}, "Invalid value for '--port'"),
        (["admin", "create-user"], {}, "Missing argument 'username'"),
        (["admin", "create-user", "bad name", "--password-stdin"], {}, "username must be"),
        (["admin", "create-user", "dave", "--password-stdin"], {}, "password must have at least"),
        (["serve"], {"CODEYARD_PORT": "not-a-port"}, "invalid setting port"),
        (["serve"], {"CODEYARD_SANDBOX_BACKEND": "vm"}, "invalid setting sandbox_backend"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args, env, message, tmp_path):
    result = run(*args, stdin="short\n", env={"CODEYARD_DATA_DIR": str(tmp_path), **env})
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("codeyard: error: ") and message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_cli_startup_does_not_import_heavy_packages():
    code = "import sys; from ide_server import cli; print(sorted(m for m in ('torch', 'transformers', 'numpy', 'fastapi', 'sqlalchemy', 'uvicorn') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr


# The app image leaves out the [llm] extra (the model runs in its own service): creating the IDE
# app must not need it, numpy and the KServe glue's tritonclient and grpc included (they load when a
# model is served in this process).
CREATE_APP_WITHOUT_THE_LLM_EXTRA = """
import sys
class NotInstalled:
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("torch", "transformers", "PIL", "safetensors", "gguf", "accelerate", "triton", "numpy",
                                  "grpc", "tritonclient", "xgrammar", "tokenizers"):
            raise ImportError(f"{name} is not installed here")
sys.meta_path.insert(0, NotInstalled())
from ide_server.app import create_app
from ide_server.settings import Settings
create_app(Settings())
print("created")
"""


def test_the_ide_app_is_created_without_the_llm_extra(tmp_path):
    result = subprocess.run([sys.executable, "-c", CREATE_APP_WITHOUT_THE_LLM_EXTRA], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "CODEYARD_DATA_DIR": str(tmp_path)})
    assert result.stdout.strip().endswith("created"), result.stderr[-2000:]


def test_sub_commands_are_registered_in_one_place_and_imported_lazily(tmp_path, monkeypatch, capsys):
    (tmp_path / "codeyard_demo_cli.py").write_text(textwrap.dedent('''
        import typer
        app = typer.Typer(help="Demo commands.")

        @app.command()
        def hello(name: str = "world") -> None:
            """Say hello."""
            print(f"hello {name}")

        @app.command()
        def fail() -> None:
            raise ValueError("the demo failed")
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.SUBCOMMANDS, "demo", ("codeyard_demo_cli:app", "Demo commands."))
    sys.modules.pop("codeyard_demo_cli", None)

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    assert "demo" in capsys.readouterr().out
    assert "codeyard_demo_cli" not in sys.modules  # listed without importing it

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "hello", "--name", "yard"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == "hello yard\n"

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "fail"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "codeyard: error: the demo failed\n"
    sys.modules.pop("codeyard_demo_cli", None)
