"""The real ide_server app's account, project and file components plus collab (until the lead wires
collab into COMPONENTS); other features are left out so their start-up cost stays out of these tests.

Run: CODEYARD_DATA_DIR=... CODEYARD_DATABASE_URL=... uvicorn --app-dir tests/collab
collab_app_factory:create --factory
"""

from fastapi import FastAPI

from collab.store import CollabBase
from ide_server.app import create_app
from ide_server.settings import Settings


def create() -> FastAPI:
    app = create_app(Settings(), component_specs=[
        "ide_server.api.health:component",
        "ide_server.api.accounts:component",
        "ide_server.api.projects:component",
        "ide_server.api.files:component",
        "collab.component:component",
    ])
    CollabBase.metadata.create_all(app.state.engine)  # until the tables are in the Alembic migrations
    return app
