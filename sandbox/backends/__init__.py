"""The isolation backends a run can use, each a `sandbox.backend.Backend`: bubblewrap (bwrap.py),
Docker (docker.py, with dockerd.py finding or starting an engine), and runner nodes through Redis
(remote.py, speaking dispatch.py's wire form). choice.py picks one from the settings."""
