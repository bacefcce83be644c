"""`codeyard secrets ...`: keep project secrets readable when the server's secret key changes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ide_server.cli import DataDir

app = typer.Typer(help="Project secrets (the environment variables of deploys and runs).", no_args_is_help=True)


@app.callback()
def secrets() -> None:
    """Project secrets (the environment variables of deploys and runs)."""


@app.command()
def reseal(
    old_key_file: Annotated[Path, typer.Option(help="A file holding the previous server secret key.")],
    data_dir: DataDir = None,
) -> None:
    """After the server's secret key changed: re-seal the secrets sealed under OLD_KEY_FILE's key."""
    from deploy_service.secret_box import SecretBox
    from deploy_service.secrets import ProjectSecrets
    from ide_server.cli import _database

    old_key = old_key_file.read_text().strip()
    if not old_key:
        raise ValueError(f"old_key_file: {old_key_file} is empty")
    with _database(data_dir) as (settings, session):
        store = ProjectSecrets(SecretBox(settings.secret))
        resealed, unreadable = store.reseal(session, SecretBox(old_key))
    typer.echo(f"re-sealed {resealed} secret{'' if resealed == 1 else 's'} under the current key")
    if unreadable:
        raise ValueError(f"{len(unreadable)} secret(s) open with neither key; set them again: {', '.join(unreadable[:20])}")
