"""Codeyard IDE server: the FastAPI app, accounts, projects, files and the `codeyard` CLI."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("codeyard")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"
