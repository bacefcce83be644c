"""What runs and deploys need from the collab rooms: open editors' text saved before a run copies the
project, and files a run wrote merged back into the editors that show them."""

from __future__ import annotations

from collab.history import AutoCheckpointer
from collab.rooms import RoomManager
from ide_server.wiring import Collab


class OpenEditors:
    """The collab rooms' side of a run: open editors' text is on disk before the run copies it in.

    Files the program writes come back through copy_out; a room that has one of them open merges
    the change on disk (its DiskMirror makes it a CRDT edit, keeping what was typed meanwhile) when
    told so here, or at its next look at the file."""

    def __init__(self, rooms: RoomManager | None, checkpoints: AutoCheckpointer | None = None) -> None:
        self._rooms, self._checkpoints = rooms, checkpoints

    @classmethod
    def of(cls, collab: Collab | None) -> OpenEditors:
        """The rooms' side of runs and deploys; without collab, nothing to save or merge."""
        return cls(collab.rooms, collab.checkpoints) if collab is not None else cls(None)

    async def flush(self, project_id: str) -> None:
        if (rooms := self._rooms) is not None:
            await rooms.flush_project(project_id)

    async def files_written(self, project_id: str, paths: list[str]) -> None:
        """Merge what a run wrote into the rooms that have it open, now rather than at their next poll."""
        if (rooms := self._rooms) is not None:
            for path in paths:
                for key in rooms.open_keys(project_id, path):
                    await rooms.file_changed(key)

    async def checkpoint(self, project_id: str, message: str) -> None:
        """Flush, then commit a history checkpoint crediting who edited (when history is on)."""
        if (checkpoints := self._checkpoints) is not None:
            await checkpoints.checkpoint_now(project_id, message)
        else:
            await self.flush(project_id)
