"""HTTP and WebSocket routes of collaboration: live editing (`editing.py`) and history (`history.py`)."""
