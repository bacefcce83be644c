"""The FastAPI application factory."""

import asyncio
import gc
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI

from ide_server import __version__, components, db, log
from ide_server.access import unguarded_routes
from ide_server.error_handlers import install_error_handlers
from ide_server.settings import Settings
from ide_server.wiring import Core, Services, check, merge, open_services

# Started, the server freezes what it holds (gc.freeze): the modules, the app and its services stay
# for its life, and every full collection walked them all, ~0.4 s each (seven a minute per worker
# under 100 students), with every request and keystroke waiting. Unfrozen at shutdown, so that a
# process making many apps (the tests) can free them. And a full collection comes after this many
# of the middle generation's (Python's default is 10: ~8 a minute per worker under that class).
FULL_COLLECTION_EVERY = 100

# Threads of the event loop's default executor (asyncio.to_thread): collab's stores and file writes,
# run planning, git checkpoints. Python's default (CPU count + 4, so 6 here) let a few slow calls
# queue every room's next store behind them.
IO_THREADS = 32


def create_app(settings: Settings | None = None, component_specs: list[str] | None = None) -> FastAPI:
    """Build the app: prepare the data dir and secret key, migrate the database, plug in components.

    component_specs: "module:attribute" names of Components; default `components.COMPONENTS`.
    Raises RuntimeError if a component adds an /api or documented route without an access rule, or
    needs a service that no loaded component builds.
    """
    settings = (settings or Settings()).prepare()
    log.configure(settings.log_level)
    loaded = components.load_all(component_specs)
    builders = merge((c.name, c.builds) for c in loaded)
    check(builders, ((c.name, c.needs) for c in loaded))
    engine = db.make_engine(settings.effective_database_url)
    db.migrate(engine)
    core = Core(settings, engine, db.make_sessionmaker(engine))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(IO_THREADS, thread_name_prefix="codeyard-io"))
        async with AsyncExitStack() as stack:
            services = await stack.enter_async_context(open_services(core, builders, app.state.services))
            log.get_logger("codeyard").info("services started", services=services.started)
            for component in loaded:
                if component.lifespan is not None:
                    await stack.enter_async_context(component.lifespan(app))
            gc.collect()
            gc.freeze()
            thresholds = gc.get_threshold()
            gc.set_threshold(thresholds[0], thresholds[1], FULL_COLLECTION_EVERY)
            try:
                yield
            finally:
                gc.set_threshold(*thresholds)
                gc.unfreeze()
        engine.dispose()

    app = FastAPI(
        title="Codeyard",
        version=__version__,
        openapi_url="/api/openapi.json",
        docs_url="/api/docs",
        redoc_url=None,
        swagger_ui_oauth2_redirect_url=None,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessionmaker = core.sessions
    app.state.services = Services()
    install_error_handlers(app)
    app.add_middleware(log.RequestLogMiddleware)
    for component in loaded:
        if component.router is not None:
            app.include_router(component.router)
        if component.setup is not None:
            component.setup(app)
    missing = unguarded_routes(app.routes, exempt={url for url in (app.openapi_url, app.docs_url) if url})
    if missing:
        raise RuntimeError(f"routes without an access rule (see ide_server/deps.py): {', '.join(missing)}")
    log.get_logger("codeyard").info(
        "app created", database=engine.dialect.name, data_dir=str(settings.data_dir), components=[c.name for c in loaded]
    )
    return app
