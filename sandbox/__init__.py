"""Sandboxed code execution: backends (bubblewrap, Docker), limits, verdicts and file transfer."""
