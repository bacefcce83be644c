"""The `codeyard` command line: serve, admin, and sub-commands that other packages register.

Adding a sub-command group (e.g. `codeyard sandbox ...`) from another package:

1. Write a Typer app in your package, e.g. `sandbox/cli.py` with `app = typer.Typer(help=...)`.
   Keep heavy imports (torch, docker...) inside the command functions, not at module top.
2. Add one line to `SUBCOMMANDS` below: `"sandbox": ("sandbox.cli:app", "Manage sandboxes.")`.

Sub-command modules are imported only when their command runs (or its own --help is shown);
`codeyard --help` lists them from the help text given here, without importing them.
Errors (domain errors, ValueError, bad options) print one line on stderr and exit with code 2.
"""

import getpass
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from typer import _click as click  # Typer 0.29 vendors Click: its classes live here
from typer._click.exceptions import ClickException, NoArgsIsHelpError
from typer.core import TyperCommand, TyperGroup

from ide_server import __version__

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from ide_server.settings import Settings
from ide_server.errors import DomainError

# name -> ("module:typer_app", one-line help). Imported lazily.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "llm": ("llm_engine.cli:app", "Serve the LLM over an OpenAI-compatible API."),
    "sandbox": ("sandbox.cli:app", "Build the runner image, check the sandbox, clean up after crashes."),
    "tutorials": ("tutorials.cli:app", "Check tutorial courses: format, and solutions pass / starters fail in the sandbox."),
    "secrets": ("deploy_service.secrets_cli:app", "Re-seal project secrets after the server's secret key changed."),
    "images": ("ide_server.images_cli:app", "Build the app, runner, LLM, PostgreSQL and Redis images without a registry."),
    "runner": ("sandbox.runner_cli:app", "Run as a runner node: execute sandbox runs dispatched through Redis."),
    "bench": ("ide_server.bench_cli:app", "Benchmark the LLM engine and its servers (python -m benchmarks)."),
}


class LazyGroup(TyperGroup):
    """A Typer group that also offers the lazily imported `SUBCOMMANDS`."""

    _listing = False

    def list_commands(self, ctx: click.Context) -> list[str]:
        return super().list_commands(ctx) + [n for n in SUBCOMMANDS if n not in self.commands]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands or cmd_name not in SUBCOMMANDS:
            return super().get_command(ctx, cmd_name)
        target, help_text = SUBCOMMANDS[cmd_name]
        if self._listing:  # help listing: don't import the module just for a line of help
            return TyperCommand(cmd_name, help=help_text)
        module_name, _, attr = target.partition(":")
        command = typer.main.get_command(getattr(import_module(module_name), attr))
        command.name = cmd_name
        return command

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="codeyard",
    cls=LazyGroup,
    help="Codeyard: a self-hostable browser IDE.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
admin_app = typer.Typer(help="Administer users.", no_args_is_help=True)
app.add_typer(admin_app, name="admin")

DataDir = Annotated[
    Path | None, typer.Option("--data-dir", help="Data folder (default: $CODEYARD_DATA_DIR or ./.codeyard).")
]


def _settings(**overrides: Any) -> "Settings":
    """Settings from the environment, with the command line's explicit options on top."""
    from ide_server.settings import Settings

    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def _version(value: bool) -> None:
    if value:
        typer.echo(f"codeyard {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Codeyard: a self-hostable browser IDE."""


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Address to listen on (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="Port (default 8000).")] = None,
    data_dir: DataDir = None,
    workers: Annotated[int | None, typer.Option(
        min=1, max=64, envvar="CODEYARD_WORKERS", help="Server processes on the port (default: one per core, up to "
        "4, where several can serve; above 1: Redis is needed, a private redis-server is started unless "
        "CODEYARD_REDIS_URL is set).")] = None,
) -> None:
    """Run the IDE server."""
    from ide_server.workers import SERVER_OPTIONS, check_combination, default_workers, serve_workers

    settings = _settings(host=host, port=port, data_dir=data_dir)
    if workers is None:
        workers, why = default_workers(settings)
        typer.echo(f"codeyard: {workers} worker{'s' if workers > 1 else ''} ({why}; set with --workers)", err=True)
    if workers > 1:
        check_combination(settings, workers)
        _announce(settings)
        serve_workers(settings, workers)
        return
    import uvicorn

    from ide_server.app import create_app

    server_app = create_app(settings)
    _announce(settings)
    uvicorn.run(server_app, host=settings.host, port=settings.port, **SERVER_OPTIONS)


def _announce(settings: "Settings") -> None:
    typer.echo(f"Codeyard {__version__} on http://{settings.host}:{settings.port}", err=True)
    if settings.deploy_apps_port:
        where = f" as http://{{slug}}.apps.{settings.deploy_apps_host}/" if settings.deploy_apps_host else ""
        typer.echo(f"Deployed apps also on port {settings.deploy_apps_port}{where}", err=True)


PasswordStdin = Annotated[
    bool, typer.Option("--password-stdin", help="Read the password from standard input (for scripts).")
]


def _read_password(from_stdin: bool) -> str:
    if from_stdin:
        return sys.stdin.readline().rstrip("\n")
    password = getpass.getpass("Password: ")
    if getpass.getpass("Repeat password: ") != password:
        raise ValueError("the passwords do not match")
    return password


@contextmanager
def _database(data_dir: Path | None) -> Iterator[tuple["Settings", "Session"]]:
    """(settings, DB session) for admin commands, on a migrated database."""
    from ide_server import db

    settings = _settings(data_dir=data_dir).prepare()
    engine = db.make_engine(settings.effective_database_url)
    try:
        db.migrate(engine)
        with db.make_sessionmaker(engine)() as session:
            yield settings, session
    finally:
        engine.dispose()


@admin_app.command("create-user")
def create_user(
    username: Annotated[str, typer.Argument(help="2-32 characters: a-z, 0-9, '-' or '_'.")],
    password_stdin: PasswordStdin = False,
    admin: Annotated[bool, typer.Option("--admin", help="Make the user an administrator.")] = False,
    data_dir: DataDir = None,
) -> None:
    """Create a user account (asks for the password unless --password-stdin)."""
    from ide_server.services import accounts

    password = _read_password(password_stdin)
    with _database(data_dir) as (settings, session):
        user = accounts.create_user(session, settings, username, password, is_admin=admin)
        typer.echo(f"created user {user.username!r}{' (admin)' if admin else ''}")


@admin_app.command("set-password")
def set_password(
    username: Annotated[str, typer.Argument(help="The user whose password to replace.")],
    password_stdin: PasswordStdin = False,
    data_dir: DataDir = None,
) -> None:
    """Replace a user's password and sign them out everywhere (API tokens stay valid)."""
    from ide_server.services import accounts

    password = _read_password(password_stdin)
    with _database(data_dir) as (settings, session):
        user = accounts.set_password(session, settings, username, password)
        typer.echo(f"new password set for {user.username!r}; their browser sessions were ended")


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"invalid setting {where}: {first.get('msg')}" if where else str(first.get("msg"))
    if isinstance(exc, DomainError):
        return exc.detail
    if isinstance(exc, ClickException):
        return exc.format_message()
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the CLI, turning errors into one line + exit code 2."""
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="codeyard", standalone_mode=False)
    except NoArgsIsHelpError as exc:  # a group called without a sub-command: help was shown
        if exc.format_message().strip():
            typer.echo(exc.format_message(), err=True)
        sys.exit(2)
    except (ClickException, DomainError, ValidationError, ValueError, ImportError, OSError) as exc:
        typer.echo(f"codeyard: error: {_one_line(exc)}", err=True)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("codeyard: aborted", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
