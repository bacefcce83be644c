"""Alembic environment: uses the server's connection when called from it, else the settings' URL."""

from alembic import context
from sqlalchemy import Connection

from ide_server.db import Base, load_models, make_engine

config = context.config
load_models()


def run() -> None:
    conn = config.attributes.get("connection")
    if conn is not None:
        _run_on(conn)
        return
    url = config.attributes.get("database_url")
    if not url:
        from ide_server.settings import Settings

        settings = Settings()
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        url = settings.effective_database_url
    with make_engine(url).begin() as connection:
        _run_on(connection)


def _run_on(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
run()
