"""Awareness states (cursors, names) of everyone in a room, with y-protocols' clock rules.

The server never interprets a state; it keeps the JSON text so late joiners get it verbatim.
"""

from __future__ import annotations

from collab.protocol import AwarenessEntry

NULL_STATE = "null"


class Presence:
    def __init__(self) -> None:
        self._clocks: dict[int, int] = {}
        self._states: dict[int, str] = {}

    def apply(self, entries: tuple[AwarenessEntry, ...] | list[AwarenessEntry]) -> list[AwarenessEntry]:
        """Apply remote entries; returns those accepted (newer clock, or a removal at the same clock)."""
        accepted = []
        for entry in entries:
            current = self._clocks.get(entry.client_id, 0)
            is_removal = entry.state_json == NULL_STATE
            if current < entry.clock or (
                current == entry.clock and is_removal and entry.client_id in self._states
            ):
                self._clocks[entry.client_id] = entry.clock
                if is_removal:
                    self._states.pop(entry.client_id, None)
                else:
                    self._states[entry.client_id] = entry.state_json
                accepted.append(entry)
        return accepted

    def remove(self, client_ids: set[int]) -> list[AwarenessEntry]:
        """Drop these clients' states; returns the removal entries to broadcast."""
        removals = []
        for client_id in client_ids:
            if client_id in self._states:
                del self._states[client_id]
                clock = self._clocks[client_id] + 1
                self._clocks[client_id] = clock
                removals.append(AwarenessEntry(client_id, clock, NULL_STATE))
        return removals

    def current(self) -> list[AwarenessEntry]:
        """Every live state, as a late joiner needs it."""
        return [
            AwarenessEntry(client_id, self._clocks[client_id], state)
            for client_id, state in self._states.items()
        ]

    def __contains__(self, client_id: int) -> bool:
        return client_id in self._states
