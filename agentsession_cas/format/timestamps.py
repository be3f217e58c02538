"""The one ``ts`` spelling RFC 0001 admits, checked for readers and produced for writers.

``ts`` is hashed as the string it is, so the format admits exactly one
spelling of an instant: UTC, uppercase ``T`` and ``Z``, seconds 00-59, a
fraction only when non-zero, without trailing zeros, at most nine digits.
"""

from __future__ import annotations

import functools
import re
import time
from datetime import UTC, datetime, timedelta

from ..errors import TimestampError, quoted

__all__ = ["is_valid_ts", "is_rfc3339", "check_ts", "format_ts", "now_ts", "normalise_ts", "ts_unix_nanos"]

_TS = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{0,8}[1-9]))?Z"
)
# Any RFC 3339 date-time, as an earlier format's writer may have spelled it.
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})"
    r"(?:\.([0-9]+))?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)


def _valid_fields(y: int, mo: int, d: int, h: int, mi: int, s: int) -> bool:
    # RFC 3339 admits year 0000, which datetime cannot hold; 2000 has the same
    # calendar (the Gregorian cycle is 400 years), so check that instead.
    try:
        datetime(y or 2000, mo, d, h, mi, s)
    except ValueError:
        return False
    return True


_TS_FAST = re.compile(
    r"([0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01]))"
    r"T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{0,8}[1-9])?Z"
)


@functools.lru_cache(maxsize=4096)
def _valid_date(date: str) -> bool:
    """Whether a YYYY-MM-DD (with month and day already in range) names a real day.
    Dates repeat across a session's entries, so the answer is cached."""
    return _valid_fields(int(date[:4]), int(date[5:7]), int(date[8:10]), 0, 0, 0)


def is_valid_ts(value: object) -> bool:
    """True when ``value`` is a string in the admitted form."""
    if not isinstance(value, str):
        return False
    m = _TS_FAST.fullmatch(value)
    return m is not None and _valid_date(m.group(1))


def is_rfc3339(value: object) -> bool:
    """True when ``value`` is an RFC 3339 date-time in any of its spellings (an offset, a
    lower-case ``t`` or ``z``, a leap second, year 0000): what a header's ``created_at``
    is, which is not hashed as an entry's ``ts`` is and so needs no one form."""
    m = _RFC3339.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        return False
    y, mo, d, h, mi, s = (int(m.group(i)) for i in range(1, 7))
    offset = m.group(8)
    if offset not in ("Z", "z") and (int(offset[1:3]) > 23 or int(offset[4:6]) > 59):
        return False
    return _valid_fields(y, mo, d, h, mi, 59 if s == 60 else s)


def check_ts(value: object) -> str:
    """Return ``value`` if admitted, else raise :class:`TimestampError` saying why."""
    if is_valid_ts(value):
        return value  # type: ignore[return-value]
    if not isinstance(value, str):
        raise TimestampError(f"ts is {type(value).__name__}, not a string")
    raise TimestampError(
        f"ts {quoted(value, 120)} is not in the admitted form (UTC, 'T' and 'Z', "
        "fraction only when non-zero, no trailing zeros, at most nine digits)"
    )


def _join(dt: datetime, fraction: str) -> str:
    fraction = fraction[:9].rstrip("0")
    # Not strftime: its %Y does not pad years before 1000 on every platform.
    base = (
        f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}"
        f"T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}"
    )
    return f"{base}.{fraction}Z" if fraction else f"{base}Z"


def format_ts(dt: datetime, nanoseconds: int | None = None) -> str:
    """Spell a datetime the admitted way.

    A naive datetime is taken as UTC. ``nanoseconds`` (0..999_999_999), when
    given, replaces the datetime's microseconds, for writers holding a
    nanosecond clock (``time.time_ns()``).
    """
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    dt = dt.astimezone(UTC)
    if nanoseconds is None:
        fraction = f"{dt.microsecond:06d}"
    else:
        if not 0 <= nanoseconds < 1_000_000_000:
            raise ValueError("nanoseconds must be in 0..999999999")
        fraction = f"{nanoseconds:09d}"
    return _join(dt.replace(microsecond=0), fraction)


def now_ts() -> str:
    """The current instant, spelled the admitted way, to the nanosecond the clock gives."""
    ns = time.time_ns()
    dt = datetime.fromtimestamp(ns // 1_000_000_000, tz=UTC)
    return format_ts(dt, ns % 1_000_000_000)


def normalise_ts(value: str) -> str:
    """Rewrite any RFC 3339 date-time to the admitted form, as migration and writers do:
    convert an offset to UTC with the instant unchanged, truncate the fraction to
    nine digits, and write a second 60 as 59 with the same fraction. An admitted
    ``ts`` comes back unchanged; a date-time that is not one, an offset outside
    -23:59..+23:59, and an instant outside years 0001-9999 UTC (what ``datetime``
    holds) raise :class:`TimestampError`."""
    if is_valid_ts(value):
        return value  # already admitted (year 0000 too)
    m = _RFC3339.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise TimestampError(f"ts {value!r} is not an RFC 3339 date-time")
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    fraction = m.group(7) or ""
    if s == 60:
        s = 59
    if y == 0 or not _valid_fields(y, mo, d, h, mi, s):
        raise TimestampError(f"ts {value!r} names no valid instant this library can convert")
    dt = datetime(y, mo, d, h, mi, s, tzinfo=UTC)
    offset = m.group(8)
    if offset not in ("Z", "z"):
        sign = 1 if offset[0] == "+" else -1
        oh, om = int(offset[1:3]), int(offset[4:6])
        if oh > 23 or om > 59:
            raise TimestampError(f"ts {value!r} has no valid offset")
        try:
            dt -= sign * timedelta(hours=oh, minutes=om)
        except OverflowError:
            raise TimestampError(f"ts {value!r} falls outside years 0001-9999 in UTC") from None
    return _join(dt, fraction)


def ts_unix_nanos(value: object) -> int | None:
    """Nanoseconds since the Unix epoch of an admitted ``ts`` (what a trace's span times
    are), or None for one that is not admitted, or before 1970."""
    m = _TS.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        return None
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    if y < 1970 or not _valid_fields(y, mo, d, h, mi, s):
        return None
    seconds = int(datetime(y, mo, d, h, mi, s, tzinfo=UTC).timestamp())
    return seconds * 1_000_000_000 + int((m.group(7) or "").ljust(9, "0"))
