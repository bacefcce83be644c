"""HTTP routes of the assistant: its own (`assistant.py`) and the IDE's /v1, /v2 and /llm/metrics over the model (`llm.py`)."""
