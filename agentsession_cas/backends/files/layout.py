"""Which layout a store directory has: its ``layout`` file, read on every open.

A missing file means no store here, or one of the earlier journal layout
(which ``agentsession migrate`` converts); ``agentsession-cas 1`` (the same
store with packs of the first format only) is read as it is and moved to
:data:`LAYOUT` by a writable open, since the packs it may then write are not
readable by the releases that wrote layout 1.
"""

from __future__ import annotations

import os
import stat

from ...errors import LayoutError
from ...fsutil import NotAFileError, fsync_dir, read_small, write_atomic
from .objects import FileObjects

__all__ = [
    "LAYOUT", "OLDER_LAYOUTS", "REFERENCE_LAYOUT", "JOURNAL", "KEPT_DIR", "STORE_DIR_NAME", "layout_text", "layout_state", "old_layout_hint",
    "check_layout", "init_layout", "find_store",
]

#: The layout this release writes and reads, as the ``layout`` file spells it.
LAYOUT = "agentsession-cas 2"
#: Earlier layouts this release reads as they are (see the module docstring).
OLDER_LAYOUTS = ("agentsession-cas 1",)
#: The layout the reference (Go) library writes today, as its ``layout`` file spells it
#: (go-cas-internals section 1.5): per-session logs of checksummed records.
REFERENCE_LAYOUT = "cas 2"
#: The earlier layout's store-wide journal, and where a migration keeps it.
JOURNAL = "journal"
KEPT_DIR = "migrated"
#: The directories a new store has (the objects' fan-out directories are made too).
_DIRS = ("objects/entries", "objects/contents", "objects/blobs", "sessions", "locks", "tmp", "trash")


def layout_text(root: str) -> str | None:
    """What the store's ``layout`` file says (trimmed), or None when there is none."""
    path = os.path.join(root, "layout")
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except IsADirectoryError:
        return "(a directory)"


#: The name of a store kept inside a project directory, found as git finds ``.git``.
STORE_DIR_NAME = ".agentsession"


def find_store(start: str) -> str | None:
    """The store a command started in ``start`` works on when none is named: ``start``
    or its nearest ancestor that is a store (a regular ``layout`` file naming a layout
    of ours: a directory that merely holds a file called ``layout`` is not one), or
    that holds one as ``.agentsession``. None when no ancestor does."""
    d = os.path.abspath(start)
    while True:
        for candidate in (d, os.path.join(d, STORE_DIR_NAME)):
            if os.path.isfile(os.path.join(candidate, "layout")):
                text = layout_text(candidate)
                if text == LAYOUT or text in OLDER_LAYOUTS:
                    return candidate
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def _journal_kind(root: str) -> str | None:
    """``file`` (the earlier layout's journal), ``tombstone`` (any non-regular file:
    a migration's symbolic link), or None."""
    try:
        st = os.lstat(os.path.join(root, JOURNAL))
    except (FileNotFoundError, NotADirectoryError):  # (a root that is a file holds no journal)
        return None
    return "file" if stat.S_ISREG(st.st_mode) else "tombstone"


def layout_state(root: str) -> str:
    """Where the store at ``root`` stands: ``current`` (our layout), ``old`` (the earlier
    journal layout, not yet touched), ``partial`` (a migration began and did not
    finish), ``reference`` (the reference library's current layout, migrated or not
    yet: its ``layout`` file is replaced last), ``other`` (a ``layout`` file naming
    another layout) or ``none``."""
    text = layout_text(root)
    if text is not None:
        if text == REFERENCE_LAYOUT:
            return "reference"
        return "current" if text == LAYOUT or text in OLDER_LAYOUTS else "other"
    journal = _journal_kind(root)
    if journal == "file":
        return "old"
    if journal == "tombstone" or os.path.exists(os.path.join(root, KEPT_DIR, JOURNAL)):
        return "partial"
    if (
        os.path.isdir(os.path.join(root, "sessions"))
        and os.path.isdir(os.path.join(root, "objects"))
        and not os.path.isdir(os.path.join(root, "objects", "blobs"))
    ):
        # The earlier layout before its first commit wrote a journal (objects/blobs is
        # ours: a store whose `init` stopped before its layout file is not this).
        return "old"
    return "none"


def old_layout_hint(root: str) -> str | None:
    """What to tell someone opening a store that needs migrating (None when it does not)."""
    state = layout_state(root)
    if state == "old":
        return (
            f"the store at {root} is of the earlier layout (a store-wide journal, no layout file) and must be "
            "migrated before this release reads or writes it: stop every writer of the earlier version, "
            "take a copy, and run `agentsession migrate`"
        )
    if state == "reference":
        begun = os.path.isdir(os.path.join(root, KEPT_DIR, "logs"))
        return (
            f"the store at {root} is of the reference library's layout ({REFERENCE_LAYOUT!r}: per-session logs "
            "of checksummed records)"
            + (", and a migration of it did not finish: run `agentsession migrate` to finish it" if begun else
               ", which this release reads only once migrated: stop every writer of the reference library, "
               "take a copy, and run `agentsession migrate`")
        )
    if state == "partial":
        return (
            f"a migration of the store at {root} from the earlier journal layout did not finish "
            "(its journal is a tombstone and there is no layout file yet): run `agentsession migrate` to finish it"
        )
    return None


def check_layout(root: str, *, readonly: bool) -> None:
    """Refuse a directory that is not a store of a layout this release reads; move an
    older layout this release reads to :data:`LAYOUT` on a writable open."""
    layout = os.path.join(root, "layout")
    try:
        text = read_small(layout, 4096).decode("utf-8", "replace").strip()
    except NotAFileError as exc:
        raise LayoutError(f"the store's layout file is damaged: {exc}") from None
    except FileNotFoundError:
        hint = old_layout_hint(root)
        if hint is not None:
            raise LayoutError(hint) from None
        raise LayoutError.no_store(f"no store at {root} (no layout file)", root) from None
    except IsADirectoryError:
        raise LayoutError(f"{layout} is a directory, not a layout file") from None
    except NotADirectoryError:
        raise LayoutError(f"no store at {root}: it is not a directory") from None
    if text == REFERENCE_LAYOUT:
        raise LayoutError(old_layout_hint(root) or text)
    if text in OLDER_LAYOUTS:
        if not readonly:
            write_atomic(layout, (LAYOUT + "\n").encode(), durable=True)
        return
    if text != LAYOUT:
        raise LayoutError(
            f"the store at {root} has layout {text!r}; this release reads {LAYOUT!r} (a newer or unknown layout)"
        )


def init_layout(root: str) -> bool:
    """Make a new store at ``root`` (an empty or new directory); False when one is there."""
    layout = os.path.join(root, "layout")
    if os.path.exists(layout):
        return False
    if os.path.isdir(root) and os.listdir(root):
        raise LayoutError(f"{root} exists and is not empty; a store needs an empty or new directory")
    for sub in _DIRS:
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    FileObjects(root).make_fanout()
    fsync_dir(os.path.join(root, "objects"))
    write_atomic(layout, (LAYOUT + "\n").encode(), durable=True)
    return True
