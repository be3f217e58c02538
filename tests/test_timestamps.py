"""The one ``ts`` spelling RFC 0001 admits (envelope table, ``ts`` row)."""

from __future__ import annotations

import calendar
import re
import time
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentsession_cas.errors import TimestampError
from agentsession_cas.format.timestamps import check_ts, format_ts, is_valid_ts, normalise_ts, now_ts

VALID = [
    "2026-09-17T12:00:02Z",
    "2026-09-17T12:00:02.5Z",
    "2026-09-17T12:00:02.05Z",
    "2026-09-17T12:00:02.000000001Z",
    "2026-09-17T12:00:02.123456789Z",
    "2026-09-17T12:00:02.100000009Z",
    "2026-09-17T23:59:59.999999999Z",
    "2024-02-29T00:00:00Z",  # leap year
    "2000-02-29T00:00:00Z",  # divisible by 400
    "0001-01-01T00:00:00Z",
    "0999-12-31T23:59:59Z",
    "9999-12-31T23:59:59.9Z",
    "0000-01-01T00:00:00Z",  # RFC 3339 admits year 0000
    "0000-02-29T00:00:00Z",  # ... a leap year in the proleptic calendar
    "1970-01-01T00:00:00Z",
]

INVALID = [
    "2026-09-17t12:00:02Z",  # lowercase t
    "2026-09-17T12:00:02z",  # lowercase z
    "2026-09-17 12:00:02Z",  # space
    "2026-09-17T12:00:02+00:00",
    "2026-09-17T12:00:02-00:00",
    "2026-09-17T14:00:02+02:00",
    "2026-09-17T12:00:02",  # no zone
    "2026-09-17T12:00:02.50Z",  # trailing zero
    "2026-09-17T12:00:02.0Z",  # zero fraction
    "2026-09-17T12:00:02.000000000Z",
    "2026-09-17T12:00:02.Z",  # empty fraction
    "2026-09-17T12:00:02.1234567891Z",  # ten digits
    "2026-09-17T12:00:02.1000000000Z",
    "2026-09-17T12:00:02,5Z",  # comma
    "2026-09-17T23:59:60Z",  # leap second
    "2026-09-17T12:00:61Z",
    "2026-09-17T24:00:00Z",
    "2026-09-17T12:60:00Z",
    "2026-02-30T12:00:00Z",
    "2025-02-29T12:00:00Z",  # not a leap year
    "1900-02-29T12:00:00Z",  # not a leap year (century)
    "2026-04-31T12:00:00Z",
    "2026-13-01T12:00:00Z",
    "2026-00-01T12:00:00Z",
    "2026-01-00T12:00:00Z",
    "2026-1-01T12:00:00Z",
    "26-09-17T12:00:02Z",
    "+2026-09-17T12:00:02Z",
    "12026-09-17T12:00:02Z",
    "2026-09-17T12:00Z",
    "2026-09-17T1:00:02Z",
    "20260917T120002Z",
    "2026-09-17",
    "2026-09-17T12:00:02Z ",
    " 2026-09-17T12:00:02Z",
    "2026-09-17T12:00:02Z\n",
    "2026-09-17T12:00:02ZZ",
    "",
    "2026-09-17T12:00:0\u0662Z",  # ARABIC-INDIC DIGIT TWO
    "\uff12026-09-17T12:00:02Z",  # FULLWIDTH DIGIT ONE
    "2026-09-17T12:00:02.\u0665Z",
    "２０２６-09-17T12:00:02Z",
    "2026\u201009-17T12:00:02Z",  # Unicode hyphen
]


@pytest.mark.parametrize("ts", VALID)
def test_valid(ts):
    assert is_valid_ts(ts)
    assert check_ts(ts) == ts
    assert normalise_ts(ts) == ts  # already admitted: unchanged


@pytest.mark.parametrize("ts", INVALID)
def test_invalid(ts):
    assert not is_valid_ts(ts)
    with pytest.raises(TimestampError):
        check_ts(ts)


@pytest.mark.parametrize("value", [None, 0, 1758110402, 1.5, b"2026-09-17T12:00:02Z", ["2026-09-17T12:00:02Z"],
                                   datetime(2026, 9, 17, tzinfo=UTC)])
def test_non_strings(value):
    assert not is_valid_ts(value)
    with pytest.raises(TimestampError, match="not a string"):
        check_ts(value)


def test_timestamp_error_is_a_value_error():
    with pytest.raises(ValueError):
        check_ts("nope")


# An oracle written independently of the module: fields, then the rules.
def oracle(year, month, day, hour, minute, second, frac, t, z) -> bool:
    if t != "T" or z != "Z":
        return False
    if frac is not None and (frac == "" or len(frac) > 9 or frac.endswith("0")):
        return False
    if not (0 <= year <= 9999 and 1 <= month <= 12):
        return False
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    days = [31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1]
    return 1 <= day <= days and hour <= 23 and minute <= 59 and second <= 59


@settings(max_examples=400, deadline=None)
@given(
    year=st.integers(0, 9999),
    month=st.integers(0, 13),
    day=st.integers(0, 32),
    hour=st.integers(0, 25),
    minute=st.integers(0, 61),
    second=st.integers(0, 61),
    frac=st.none() | st.text("0123456789", max_size=11),
    t=st.sampled_from(["T", "T", "T", "t", " "]),
    z=st.sampled_from(["Z", "Z", "Z", "z", "+00:00", "-05:30", ""]),
)
@example(2024, 2, 29, 0, 0, 0, None, "T", "Z")
@example(2023, 2, 29, 0, 0, 0, None, "T", "Z")
@example(2100, 2, 29, 0, 0, 0, None, "T", "Z")
@example(2026, 1, 1, 0, 0, 59, "999999999", "T", "Z")
@example(2026, 1, 1, 0, 0, 59, "9999999990", "T", "Z")
def test_is_valid_ts_matches_oracle(year, month, day, hour, minute, second, frac, t, z):
    ts = f"{year:04d}-{month:02d}-{day:02d}{t}{hour:02d}:{minute:02d}:{second:02d}"
    if frac is not None:
        ts += "." + frac
    ts += z
    assert is_valid_ts(ts) == oracle(year, month, day, hour, minute, second, frac, t, z), ts


# --------------------------------------------------------------------------
# format_ts

_PARSE = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?Z", re.ASCII)


def parse(ts: str) -> tuple[datetime, int]:
    """(UTC datetime to the second, nanoseconds) of an admitted ts."""
    m = _PARSE.fullmatch(ts)
    assert m, ts
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    ns = int((m.group(7) or "").ljust(9, "0"))
    return datetime(y, mo, d, h, mi, s, tzinfo=UTC), ns


@pytest.mark.parametrize(
    "dt,ns,expected",
    [
        (datetime(2026, 9, 17, 12, 0, 2), None, "2026-09-17T12:00:02Z"),
        (datetime(2026, 9, 17, 12, 0, 2, 500000), None, "2026-09-17T12:00:02.5Z"),
        (datetime(2026, 9, 17, 12, 0, 2, 1), None, "2026-09-17T12:00:02.000001Z"),
        (datetime(2026, 9, 17, 12, 0, 2, 123450), None, "2026-09-17T12:00:02.12345Z"),
        (datetime(2026, 9, 17, 12, 0, 2, tzinfo=UTC), None, "2026-09-17T12:00:02Z"),
        (datetime(2026, 9, 17, 14, 0, 2, tzinfo=timezone(timedelta(hours=2))), None, "2026-09-17T12:00:02Z"),
        (datetime(2026, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1))), None, "2025-12-31T23:30:00Z"),
        (datetime(2026, 12, 31, 20, 0, tzinfo=timezone(timedelta(hours=-5, minutes=-30))), None,
         "2027-01-01T01:30:00Z"),
        (datetime(2026, 9, 17, 12, 0, 2, 999999), 0, "2026-09-17T12:00:02Z"),
        (datetime(2026, 9, 17, 12, 0, 2), 1, "2026-09-17T12:00:02.000000001Z"),
        (datetime(2026, 9, 17, 12, 0, 2), 500_000_000, "2026-09-17T12:00:02.5Z"),
        (datetime(2026, 9, 17, 12, 0, 2), 999_999_999, "2026-09-17T12:00:02.999999999Z"),
        (datetime(2026, 9, 17, 12, 0, 2), 120_000_000, "2026-09-17T12:00:02.12Z"),
        (datetime(999, 1, 2, 3, 4, 5), None, "0999-01-02T03:04:05Z"),
        (datetime(1, 1, 1), None, "0001-01-01T00:00:00Z"),
        (datetime(9999, 12, 31, 23, 59, 59, 999999), None, "9999-12-31T23:59:59.999999Z"),
    ],
)
def test_format_ts(dt, ns, expected):
    assert format_ts(dt, ns) == expected
    assert is_valid_ts(expected)


@pytest.mark.parametrize("ns", [-1, 1_000_000_000, 10**12])
def test_format_ts_refuses_bad_nanoseconds(ns):
    with pytest.raises(ValueError):
        format_ts(datetime(2026, 1, 1), ns)


offsets = st.integers(-23 * 60 - 59, 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))


@settings(max_examples=300, deadline=None)
@given(
    dt=st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    tz=st.none() | offsets,
    ns=st.none() | st.integers(0, 999_999_999),
)
@example(dt=datetime(999, 1, 1), tz=None, ns=None)
@example(dt=datetime(2026, 1, 1, 0, 0, 0, 100000), tz=None, ns=None)
def test_format_ts_round_trip(dt, tz, ns):
    if tz is not None:
        dt = dt.replace(tzinfo=tz)
    ts = format_ts(dt, ns)
    assert is_valid_ts(ts), ts
    assert check_ts(ts) == ts
    assert normalise_ts(ts) == ts
    back, back_ns = parse(ts)
    aware = dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)
    assert back == aware.replace(microsecond=0)  # the same instant, to the second
    assert back_ns == (aware.microsecond * 1000 if ns is None else ns)


def test_now_ts():
    before = time.time()
    ts = now_ts()
    after = time.time()
    assert is_valid_ts(ts), ts
    at, ns = parse(ts)
    stamp = calendar.timegm(at.utctimetuple()) + ns / 1e9
    assert before - 1 <= stamp <= after + 1


# --------------------------------------------------------------------------
# normalise_ts


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("2026-09-17T12:00:02Z", "2026-09-17T12:00:02Z"),
        ("2026-09-17t12:00:02z", "2026-09-17T12:00:02Z"),
        ("2026-09-17 12:00:02Z", "2026-09-17T12:00:02Z"),
        ("2026-09-17T12:00:02+00:00", "2026-09-17T12:00:02Z"),
        ("2026-09-17T12:00:02-00:00", "2026-09-17T12:00:02Z"),
        ("2026-09-17T14:00:02+02:00", "2026-09-17T12:00:02Z"),
        ("2026-09-17T06:30:02-05:30", "2026-09-17T12:00:02Z"),
        ("2026-01-01T00:30:00+01:00", "2025-12-31T23:30:00Z"),
        ("2024-02-28T23:00:00-01:00", "2024-02-29T00:00:00Z"),
        ("2026-09-17T12:00:02.500Z", "2026-09-17T12:00:02.5Z"),
        ("2026-09-17T12:00:02.0Z", "2026-09-17T12:00:02Z"),
        ("2026-09-17T12:00:02.000000000000Z", "2026-09-17T12:00:02Z"),
        ("2026-09-17T12:00:02.1234567891234Z", "2026-09-17T12:00:02.123456789Z"),
        ("2026-09-17T12:00:02.1234567899Z", "2026-09-17T12:00:02.123456789Z"),  # truncated, not rounded
        ("2026-09-17T12:00:02.9999999999Z", "2026-09-17T12:00:02.999999999Z"),
        ("2026-09-17T12:00:02.1000000009Z", "2026-09-17T12:00:02.1Z"),
        ("2026-09-17T12:00:02.25+01:00", "2026-09-17T11:00:02.25Z"),
        ("2016-12-31T23:59:60Z", "2016-12-31T23:59:59Z"),
        ("2016-12-31T23:59:60.5Z", "2016-12-31T23:59:59.5Z"),
        ("2017-01-01T00:59:60.25+01:00", "2016-12-31T23:59:59.25Z"),
        ("0999-06-01T00:00:00+01:00", "0999-05-31T23:00:00Z"),
    ],
)
def test_normalise_ts(raw, expected):
    assert normalise_ts(raw) == expected
    assert is_valid_ts(expected)


@pytest.mark.parametrize(
    "raw",
    [
        "2026-09-17",
        "2026-09-17T12:00:02",
        "2026-09-17T12:00Z",
        "2026-09-17T12:00:02+0200",
        "2026-09-17T12:00:02+02",
        "2026-09-17T12:00:02.Z",
        "2026-02-30T12:00:00Z",
        "2026-09-17T24:00:00Z",
        "2026-09-17T12:00:61Z",
        "2026-09-17T12:00:02+24:00",
        "2026-09-17T12:00:02+01:60",
        "0001-01-01T00:30:00+01:00",  # before year 1 in UTC
        "9999-12-31T23:30:00-01:00",  # after year 9999 in UTC
        "0000-01-01T00:00:00+01:00",
        "",
        "2026-09-17T12:00:0\u0662Z",
    ],
)
def test_normalise_ts_refuses(raw):
    with pytest.raises(TimestampError):
        normalise_ts(raw)


@pytest.mark.parametrize("value", [None, 5, b"2026-09-17T12:00:02Z"])
def test_normalise_ts_refuses_non_strings(value):
    with pytest.raises(TimestampError):
        normalise_ts(value)


@settings(max_examples=300, deadline=None)
@given(
    dt=st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31)),
    offset_min=st.integers(-23 * 60 - 59, 23 * 60 + 59),
    frac=st.none() | st.text("0123456789", min_size=1, max_size=14),
    leap=st.booleans(),
    t=st.sampled_from("Tt "),
    zulu=st.sampled_from(["Z", "z"]),
)
def test_normalise_ts_keeps_the_instant(dt, offset_min, frac, leap, t, zulu):
    sign = "+" if offset_min >= 0 else "-"
    hh, mm = divmod(abs(offset_min), 60)
    second = 60 if leap else dt.second
    local = f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}"
    raw = f"{local}{t}{dt.hour:02d}:{dt.minute:02d}:{second:02d}"
    if frac is not None:
        raw += "." + frac
    raw_zoned = raw + (zulu if offset_min == 0 and leap else f"{sign}{hh:02d}:{mm:02d}")
    out = normalise_ts(raw_zoned)
    assert is_valid_ts(out), (raw_zoned, out)
    assert normalise_ts(out) == out
    got, got_ns = parse(out)
    expected = dt.replace(second=59 if leap else dt.second, microsecond=0, tzinfo=UTC) - timedelta(
        minutes=offset_min
    )
    assert got == expected
    assert got_ns == int((frac or "")[:9].ljust(9, "0"))
