"""Tutorials as an ide_server component: courses, lesson projects and classrooms under /api."""

from fastapi import APIRouter

from ide_server.components import Component
from tutorials.api import lesson_router, router

routes = APIRouter()
routes.include_router(router)
routes.include_router(lesson_router)

component = Component(name="tutorials", router=routes)
