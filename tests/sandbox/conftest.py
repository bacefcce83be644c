"""The shared sandbox fixtures (tests/sandbox_fixtures.py); tests here import make_spec from this module."""

from sandbox_fixtures import *  # noqa: F401,F403
from sandbox_fixtures import TEST_LIMITS, leftovers, make_spec  # noqa: F401
