"""The progress hook long operations take: ``progress(done, total)``, called now and
then as the work goes (entries, lines or bytes, as the operation says). The library
never prints; the command renders what it is told, on a terminal only."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

Progress = Callable[[int, int], None]

T = TypeVar("T")

#: How many items pass between two calls of the hook: often enough to redraw, cheap to count.
EVERY = 1024


def reported(items: Iterable[T], total: int, progress: Progress | None, *, every: int = EVERY) -> Iterable[T]:
    """``items`` passed on as they come, ``progress(done, total)`` called every ``every``
    items and once at the end (``total`` grows to ``done`` if it was an estimate);
    ``items`` itself when there is no hook, so a reader pays nothing for it."""
    if progress is None:
        return items
    return _reporting(items, total, progress, every)


def _reporting(items: Iterable[T], total: int, progress: Progress, every: int) -> Iterator[T]:
    done = 0
    for item in items:
        yield item
        done += 1
        if done % every == 0:
            progress(done, max(total, done))
    progress(done, max(total, done))
