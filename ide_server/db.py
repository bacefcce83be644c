"""Database engine, sessions and schema migrations (SQLite in WAL mode or PostgreSQL)."""

from importlib import import_module
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, make_url, text
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from ide_server import sqlite_writer

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# Any constant works: it only has to be the same for every replica running migrations.
PG_MIGRATION_LOCK = 7_202_611


# Modules whose tables (subclasses of Base) the migrations cover. A package that adds tables
# appends its models module here and adds a revision to ide_server/migrations/versions/
# (`alembic -c ide_server/migrations/alembic.ini revision --autogenerate -m "..."`).
MODEL_MODULES: list[str] = ["ide_server.models", "sandbox.models", "collab.store", "deploy_service.secret_models", "tutorials.models", "assistant.models", "deploy_service.models"]


class Base(DeclarativeBase):
    """Base class of every table."""


def load_models() -> None:
    """Import every module in MODEL_MODULES so Base.metadata knows all tables."""
    for name in MODEL_MODULES:
        import_module(name)


# Sync routes and dependencies run on anyio's 40 worker threads, other blocking work on the event
# loop's executor (app.IO_THREADS): each thread holds at most one connection at a time, and only
# briefly (no session lives across an await), so this many never run dry in practice.
POOL_SIZE = 20
POOL_OVERFLOW = 60
# Past this wait a request answers 503 with Retry-After (error_handlers) instead of hanging.
POOL_TIMEOUT_S = 10
# SQLite: how long a writer waits for the single write lock before "database is locked" (503).
SQLITE_BUSY_TIMEOUT_S = 10


def make_engine(url: str) -> Engine:
    """Engine with SQLite tuned for concurrent web use (WAL, busy timeout, foreign keys)."""
    pool = {"pool_size": POOL_SIZE, "max_overflow": POOL_OVERFLOW, "pool_timeout": POOL_TIMEOUT_S}
    if url.startswith("sqlite"):
        # One writer at a time, queued in Python and, between processes, on a file beside the
        # database (see sqlite_writer); SQLite's busy timeout stays underneath.
        database = make_url(url).database
        lock_file = Path(f"{database}.writer-lock") if database and database != ":memory:" else None
        factory = sqlite_writer.connection_class(sqlite_writer.WriterLock(lock_file), SQLITE_BUSY_TIMEOUT_S)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S,
                                                  "factory": factory}, **pool)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, **pool)


def _sqlite_pragmas(dbapi_conn: Any, _record: object) -> None:  # a DB-API connection (sqlite3's)
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str) -> Config:
    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["database_url"] = url
    return cfg


def migrate(engine: Engine) -> None:
    """Upgrade the schema to head; on PostgreSQL an advisory lock keeps replicas from racing."""
    url = engine.url.render_as_string(hide_password=False)
    cfg = alembic_config(url)
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_MIGRATION_LOCK})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("")).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
