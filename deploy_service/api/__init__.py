"""HTTP and WebSocket routes of deploys: deployments, their logs and the apps gateway (`deployments.py`), and project
secrets (`secrets.py`)."""
