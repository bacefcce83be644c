"""The real ide_server app's account, project and file components plus collab; other features are
left out so their start-up cost stays out of these tests.

Run: CODEYARD_DATA_DIR=... CODEYARD_DATABASE_URL=... uvicorn --app-dir tests/collab
collab_app_factory:create --factory
"""

from fastapi import FastAPI

from ide_server.app import create_app
from ide_server.settings import Settings


def create() -> FastAPI:
    return create_app(Settings(), component_specs=[
        "ide_server.api.health:component",
        "ide_server.api.accounts:component",
        "ide_server.api.projects:component",
        "ide_server.api.files:component",
        "collab.api.editing:component",
        "ide_server.api.events:component",
        "collab.api.history:component",
    ])
