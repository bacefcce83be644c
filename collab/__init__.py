"""Real-time collaborative editing: CRDT rooms over the y-websocket protocol (built in issue 3)."""
