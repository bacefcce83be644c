"""The browser pages (ide_server/web_pages.py, written with the front end) as a component."""

from ide_server.components import Component
from ide_server.web_pages import mount_web

component = Component(name="web", setup=mount_web)
