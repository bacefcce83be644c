"""Real-time collaborative editing: CRDT rooms over the y-websocket protocol.

Entry points: RoomManager (rooms.py) owns the rooms of a process; serve_websocket (websocket.py)
runs one client session on an authorised websocket; UpdateStore (store.py) is the durable log;
Fanout (fanout.py) shares rooms between replicas through Redis.
"""
