"""The token bucket (with a fake clock; in Redis for several servers), the ghost text cut from completions and its indentation, continued answers,
the failing line given to Explain."""

from __future__ import annotations

import pytest
import redis
from redis_server import RedisServer

from assistant.prompts import (
    CONTINUE,
    completion_prompt,
    continued,
    explain_messages,
    ghost_text,
    line_is_complete,
    reindent,
)
from assistant.ratelimit import RateLimiter, SharedRateLimiter
from assistant.schemas import ExplainCreate
from assistant.service import failing_line

from .helpers import bodies


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_bucket_allows_a_burst_then_refills_at_the_rate_per_user():
    clock = FakeClock()
    limiter = RateLimiter(per_minute=6, burst=3, clock=clock)  # one call every 10 s
    assert [limiter.take("ada") for _ in range(3)] == [0, 0, 0]
    assert limiter.take("ada") == 10  # empty: the next call is 10 s away
    assert limiter.take("bob") == 0  # others have their own bucket
    clock.now += 10
    assert limiter.take("ada") == 0
    assert limiter.take("ada", cost=2) == 20
    clock.now += 3600
    assert [limiter.take("ada") for _ in range(4)] == [0, 0, 0, 10]  # refills up to the burst, not beyond


@pytest.mark.parametrize(("kwargs", "field"), [({"per_minute": 0, "burst": 1}, "per_minute"),
                                               ({"per_minute": 1, "burst": 0}, "burst")])
def test_bad_limits_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        RateLimiter(**kwargs)


@pytest.mark.parametrize(("generated", "after_cursor", "ghost"), [
    (" + b\n\ndef main():", "", " + b"),                # the rest of the line
    ("\n    return total\nprint()", "", "\n    return total"),  # the line was complete: the next one
    ("\n\n", "", ""),                                     # nothing but blank lines: no suggestion
    ('name)\nprint("x")', ")", "name"),                   # what is right of the cursor is not repeated
    ("1, 2]```\n", "", "1, 2]"),                          # a markdown fence ends it
])
def test_ghost_text(generated, after_cursor, ghost):
    assert ghost_text(generated, after_cursor) == ghost


def test_generation_stops_once_the_line_is_complete():
    assert not line_is_complete(" + b")
    assert line_is_complete(" + b\n")
    assert not line_is_complete("\n\n    return")
    assert line_is_complete("\n    return x\n")
    assert line_is_complete("x```")


def test_completion_prompt_puts_other_files_first_and_keeps_the_text_near_the_cursor():
    prefix = "x = 1\n" * 1000 + "print(area_"
    prompt = completion_prompt("main.py", prefix, [("shapes.js", "function area_of() {}"), ("main.py", "stale")])
    assert prompt.startswith("// file: shapes.js\nfunction area_of() {}\n")
    assert "stale" not in prompt  # the current file comes from the editor, not from its tab list entry
    assert prompt.endswith("# file: main.py\n…" + prefix[-2000:])


@pytest.mark.parametrize(("text", "unit", "to", "first_line", "expected"), [
    ("def f():\n  if x:\n    y()\n  ", "  ", "    ", True, "def f():\n    if x:\n        y()\n    "),  # editor -> model
    ("\n        return x", "    ", "  ", False, "\n    return x"),      # model -> editor, on the next line
    ("\n        return x", "    ", "\t", False, "\n\t\treturn x"),     # tabs
    ("    return x", "    ", "  ", True, "  return x"),                  # the cursor was in the indentation
    ("    # note", "    ", "  ", False, "    # note"),                   # after code: spacing, not indentation
    ("\tif x:\n\t\t  y", "\t", "    ", True, "    if x:\n          y"), # columns past the levels stay spaces
])
def test_reindent(text, unit, to, first_line, expected):
    assert reindent(text, unit, to, first_line) == expected


def test_a_continued_answer_asks_for_the_rest_after_what_was_said():
    asked = [{"role": "user", "content": "Why?"}]
    assert continued(asked, "Because the") == [*asked, {"role": "assistant", "content": "Because the"},
                                               {"role": "user", "content": CONTINUE}]


def test_explain_points_the_model_at_the_failing_line_of_the_students_file():
    body = ExplainCreate(**bodies()["explain"])  # a TypeError raised in add(), line 2
    messages = explain_messages(body.path, body.content, body.output, failing_line(body))
    assert "The error points at line 2:\n```\nreturn a + b\n```" in messages[-1]["content"]
    no_trace = ExplainCreate(path="main.py", content="print(1)\n", output="Killed\n")
    assert failing_line(no_trace) is None
    assert "points at" not in explain_messages(no_trace.path, no_trace.content, no_trace.output, None)[-1]["content"]


def test_servers_sharing_redis_share_each_users_bucket(tmp_path):
    """Two workers (or replicas) behind one port: a user whose calls alternate between them gets one rate,
    not one each; Redis gone, each process's own buckets decide (the assistant stays up)."""
    server = RedisServer(tmp_path).start()
    try:
        client = redis.Redis.from_url(server.url)
        one, other = (SharedRateLimiter(redis.Redis.from_url(server.url), per_minute=6, burst=3) for _ in range(2))
        assert [limiter.take("ada") for limiter in (one, other, one)] == [0, 0, 0]
        assert other.take("ada") == 10 and one.take("ada") == 10  # the burst is spent across both
        assert other.take("bob") == 0
        assert client.ttl(f"{SharedRateLimiter.PREFIX}ada") > 0  # forgotten once full again
        server.kill()
        assert [one.take("ada") for _ in range(4)] == [0, 0, 0, 10]
    finally:
        server.kill()
