"""Tutorials as an ide_server component: courses, lesson projects and classrooms under /api."""

from fastapi import APIRouter, FastAPI

from ide_server.components import Component
from ide_server.error_handlers import answer_like_domain_errors
from sandbox import SandboxError
from tutorials.api import lesson_router, router

routes = APIRouter()
routes.include_router(router)
routes.include_router(lesson_router)


def _setup(app: FastAPI) -> None:
    answer_like_domain_errors(app, SandboxError)  # checks raise them, with or without the sandbox component


component = Component(name="tutorials", router=routes, setup=_setup)
