"""The file backend: a store as a directory (``docs/storage-format.md`` lays it out byte by byte).

Objects loose or in zstd packs (:mod:`.objects`, :mod:`.packs`), sessions as
directories whose checksummed log carries its appends' objects until a
checkpoint writes them out (:mod:`.sessions`, :mod:`.log`), refs and remote
state as small files (:mod:`.refs`, :mod:`.remotes`), durability in one
place (:mod:`.fsutil`), the layout file (:mod:`.layout`), and the migration
of the earlier journal layout (:mod:`.migrate`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from ...errors import AgentSessionError, ReadOnlyError
from ..base import Backend, Capabilities, FsckReport, RepackResult, Retained, RetentionSource
from .layout import check_layout, init_layout
from .objects import AUTO_PACK_LOOSE, FileObjects
from .refs import FileRefs
from .remotes import FileRemotes
from .sessions import FileSessions
from .sweep import retention_sources, sweep_objects, writers_holding

__all__ = ["FileBackend"]


class FileBackend(Backend):
    """A store directory, opened read-only or for writing."""

    capabilities = Capabilities(persistent=True, packs=True, sweep=True, repair=True, migrate=True)
    young_unit = "file"  # a young pack or loose file is left whole

    def __init__(self, root: str | os.PathLike[str], *, readonly: bool = False):
        self.root = os.path.abspath(os.path.expanduser(os.fspath(root)))
        self.url = self.root
        self.readonly = readonly
        check_layout(self.root, readonly=readonly)
        self.objects: FileObjects = FileObjects(self.root)
        self.sessions: FileSessions = FileSessions(self)
        self.refs: FileRefs = FileRefs(self.root)
        self.remotes: FileRemotes = FileRemotes(self.root, readonly=readonly)

    @classmethod
    def init(cls, root: str | os.PathLike[str], **kwargs: Any) -> tuple[FileBackend, bool]:
        """Create a store directory (or find the one there); returns it and whether it was made."""
        path = os.path.abspath(os.path.expanduser(os.fspath(root)))
        made = init_layout(path)
        return cls(path, **kwargs), made

    def describe(self) -> str:
        return f"the store at {self.root}"

    def require_writable(self) -> None:
        if self.readonly:
            raise ReadOnlyError(f"the store at {self.root} is open read-only")

    def close(self) -> None:
        """Pack loose objects once there are many (as ``git gc --auto`` does) and merge
        small packs, when a writer closes rather than inside an append; a store that
        wrote nothing here pays nothing however big it is.

        Every object is durable before this runs, so a device that refuses the packing
        (full, or made read-only) fails nothing the command did: the objects stay as
        they are, a pack cut short is a temporary file the next sweep removes, and the
        next writing close packs them."""
        try:
            if not self.readonly and self.objects.wrote:
                if self.objects.estimate_loose() >= AUTO_PACK_LOOSE:
                    self.objects.pack_loose()
                self.objects.merge_small_packs()
        except OSError:
            pass  # see above: an optimisation the device refused, nothing lost
        except AgentSessionError:
            self.objects.close()
            raise
        self.objects.close()

    # -- maintenance hooks ------------------------------------------------------------

    def pack(self, **kwargs: Any) -> RepackResult:
        """Repack every loose and packed object into one pack; see :meth:`FileObjects.repack`."""
        self.require_writable()
        return self.objects.repack(**kwargs)

    def fsck(self, store: Any, *, progress: Callable[[str], None] | None = None) -> FsckReport:
        """The whole directory walked (objects, packs, logs, indexes, refs, leftovers)."""
        from .fsck import fsck_files

        return fsck_files(store, progress=progress)

    def retention_sources(self) -> Iterator[RetentionSource]:
        return retention_sources(self.root)

    def writers_holding(self) -> list[str] | None:
        return writers_holding(self.root)

    def sweep_objects(
        self, compute: Callable[[bool], Retained], *, grace: float, dry_run: bool, wait: float,
        progress: Callable[[int, int], None] | None,
    ) -> tuple[RepackResult, int, list[str], Retained]:
        return sweep_objects(self.objects, self.root, compute, grace=grace, dry_run=dry_run, wait=wait, progress=progress)
