"""The IDE assistant: ghost-text completions, "Explain this error" and chat about a file.

It serves project members over the IDE's own LLM (the same service as /v1, loading from start-up), under
a per-user token bucket and a per-project switch that owners (e.g. teachers) can turn off.
"""
