"""Canonical JSON (RFC 8785) and the I-JSON test of RFC 0001 "Entry hash".

The oracle for canonical bytes is the independent ``rfc8785`` package.

Comparison domain. ``rfc8785.dumps`` refuses every ``int`` outside
±(2**53 - 1) (``IntegerDomainError``), while RFC 0001's whole-number rule
admits an integer beyond it when it is exact in binary64 or equals the
canonical rendering of the nearest double (2**53, 2**60,
1152921504606847000, ...). For those the canonical form is by definition the
rendering of the double, so the oracle is ``rfc8785.dumps(float(n))``: the
tests map such ints to ``float`` before asking ``rfc8785``, and generate
them only from doubles (``int(f)``, or the digits ``rfc8785`` renders for
``f``), never from our own code. Integers inside ±(2**53 - 1) go to
``rfc8785`` as they are. Lone surrogates are outside the domain (both sides
refuse them; tested separately).
"""

from __future__ import annotations

import json
import random
from decimal import Decimal

import pytest
import rfc8785
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentsession_cas.format import canonical
from agentsession_cas.format.canonical import (
    IJSONError,
    canonical_bytes,
    canonical_str,
    canonical_str_reference,
    check_whole_number,
    loads,
    number_to_json,
)
from storetools import short_of_stack

SAFE = 2**53 - 1

# --------------------------------------------------------------------------
# Strategies

# Characters that stress escaping and UTF-16 ordering: control characters,
# quote and backslash, DEL, U+2028/2029, BOM, the private-use/specials block
# U+E000-U+FFFF (which sorts *after* supplementary characters in UTF-16
# but *before* them by code point), and supplementary characters.
SPECIAL_CHARS = [
    "\x00", "\x01", "\x08", "\t", "\n", "\x0b", "\x0c", "\r", "\x1f", " ",
    '"', "\\", "/", "\x7f", "\x80", "\u00e9", "\u2028", "\u2029", "\u20ac",
    "\ud7ff", "\ue000", "\uf8ff", "\ufb33", "\ufeff", "\ufffd", "\uffff",
    "\U00010000", "\U0001f600", "\U0001f4a9", "\U0010ffff", "a", "b", "1",
]
chars = st.one_of(
    st.sampled_from(SPECIAL_CHARS),
    st.characters(blacklist_categories=("Cs",)),  # any scalar value
)
strings = st.text(chars, max_size=8)
# Few distinct names, so objects often hold names that share prefixes or
# straddle the U+E000/supplementary boundary.
member_names = st.one_of(
    st.text(st.sampled_from(["a", "b", "\ue000", "\uffff", "\U0001f600", "\U00010000", "\ufffd", "\x00"]), max_size=3),
    strings,
)

SPECIAL_FLOATS = [
    0.0, -0.0, 0.1, -0.1, 1.0, 1e-7, 1e-6, 9.999999999999997e-7, 1e20, 1e21,
    9.999999999999997e22, 1e23, 1.0000000000000001e23, 5e-324, -5e-324,
    2.2250738585072014e-308, 2.225073858507201e-308, 1.7976931348623157e308,
    -1.7976931348623157e308, 333333333.3333333, 1424953923781206.2,
    9007199254740992.0, 9007199254740994.0, 2.0**60, 123456789012345680.0,
    4.35, 0.000001234, 1.5e-7,
]
floats = st.one_of(
    st.sampled_from(SPECIAL_FLOATS),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=-1e-300, max_value=1e-300, allow_nan=False),  # tiny/subnormal
    st.floats(min_value=1e15, max_value=1e25),  # around 2**53 and 10**21
)
safe_ints = st.one_of(
    st.integers(-SAFE, SAFE),
    st.sampled_from([0, -1, 10**15, -(10**15), 10**15 - 1, 999999999999999, SAFE, -SAFE]),
)


def rendered_whole(f: float) -> int:
    """The whole number rfc8785 writes for a double >= 2**53 (no exponent below 1e21)."""
    return int(Decimal(rfc8785.dumps(f).decode()))


big_doubles = st.floats(min_value=2.0**53, max_value=1e300).filter(lambda f: f == int(f))
# Integers beyond ±(2**53 - 1) that the whole-number rule admits: the exact
# value of a double, or the digits of its canonical rendering.
big_ok_ints = st.builds(
    lambda f, neg, rendered: (-1 if neg else 1) * (rendered_whole(f) if rendered else int(f)),
    big_doubles,
    st.booleans(),
    st.booleans(),
)

scalars = st.one_of(st.none(), st.booleans(), safe_ints, floats, strings, big_ok_ints)


def containers(children):
    return st.one_of(
        st.lists(children, max_size=5),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(member_names, children, max_size=6),
    )


json_values = st.recursive(scalars, containers, max_leaves=25)


def to_rfc_domain(value):
    """Map a value to what rfc8785 accepts: big admitted ints become their double."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -SAFE <= value <= SAFE else float(value)
    if isinstance(value, dict):
        return {k: to_rfc_domain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_rfc_domain(v) for v in value]
    return value


def oracle(value) -> bytes:
    return rfc8785.dumps(to_rfc_domain(value))


# --------------------------------------------------------------------------
# The main property: both serialisers agree with rfc8785


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_canonical_matches_rfc8785(value):
    expected = oracle(value)
    assert canonical_bytes(value) == expected
    assert canonical_str_reference(value).encode("utf-8") == expected
    assert canonical_str(value).encode("utf-8") == expected


@settings(max_examples=150, deadline=None)
@given(json_values, st.randoms(use_true_random=False))
def test_canonical_is_independent_of_spelling_and_order(value, rnd):
    """Re-spelling a value (member order, whitespace, \\u escapes) does not change
    its canonical bytes, and canonical bytes parse back to themselves."""

    def shuffled(v):
        if isinstance(v, dict):
            items = list(v.items())
            rnd.shuffle(items)
            return {k: shuffled(x) for k, x in items}
        if isinstance(v, (list, tuple)):
            return [shuffled(x) for x in v]
        return v

    expected = canonical_bytes(value)
    respelled = json.dumps(shuffled(value), ensure_ascii=True, indent=rnd.choice([None, 1]))
    assert canonical_bytes(loads(respelled), parsed=True) == expected
    assert canonical_bytes(loads(expected), parsed=True) == expected
    assert canonical_bytes(loads(expected)) == expected


@settings(max_examples=300, deadline=None)
@given(floats)
@example(5e-324)
@example(1e21)
@example(-0.0)
def test_number_to_json_matches_rfc8785(f):
    assert number_to_json(f).encode() == rfc8785.dumps(f)
    # And it round-trips to the same double.
    assert float(number_to_json(f)) == f


# --------------------------------------------------------------------------
# Explicit examples


# RFC 8785 Appendix B (IEEE 754 bit patterns and their ECMAScript rendering).
RFC8785_NUMBERS = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


@pytest.mark.parametrize("bits,text", RFC8785_NUMBERS)
def test_rfc8785_appendix_b_numbers(bits, text):
    import struct

    f = struct.unpack(">d", bytes.fromhex(bits))[0]
    assert number_to_json(f) == text
    assert canonical_bytes(f) == text.encode()
    assert canonical_bytes([f]) == b"[" + text.encode() + b"]"
    assert canonical_str_reference({"n": f}) == '{"n":' + text + "}"


def test_rfc8785_sorting_example():
    """RFC 8785 section 3.2.3: names sorted as UTF-16 code units, so the
    emoji (a surrogate pair, D83D...) sorts before U+FB33."""
    value = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    keys = [k for k in json.loads(canonical_bytes(value))]
    assert keys == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]


# (value, canonical bytes, why the C encoder's output would be wrong)
FALLBACK_CASES = [
    ({"\U0001f600": 1, "\ufffd": 2}, '{"\U0001f600":1,"\ufffd":2}'.encode()),
    ({"\ue000": 1, "\U00010000": 2}, '{"\U00010000":2,"\ue000":1}'.encode()),
    ({"a": {"\uffff": 0, "\U0010ffff": 1}}, '{"a":{"\U0010ffff":1,"\uffff":0}}'.encode()),
    (1e20, b"100000000000000000000"),
    (1e-7, b"1e-7"),
    (1.0, b"1"),
    (-0.0, b"0"),
    ([1e16], b"[10000000000000000]"),
    ({"x": 1e-5}, b'{"x":0.00001}'),
    (2**60, b"1152921504606847000"),
    (-(2**60), b"-1152921504606847000"),
    ([2**66], b"[73786976294838210000]"),
    ([2**70], b"[1.1805916207174113e+21]"),
    ({"k": 10**21}, b'{"k":1e+21}'),
    ({"k": 2**80}, b'{"k":1.2089258196146292e+24}'),
]


@pytest.mark.parametrize("value,expected", FALLBACK_CASES)
def test_fast_path_falls_back(value, expected):
    assert canonical_bytes(value) == expected
    assert canonical_str_reference(value).encode() == expected
    assert oracle(value) == expected
    # The case is discriminating: the C encoder alone gets it wrong, so only
    # the fallback to the reference serialiser can produce the right bytes.
    raw = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()
    assert raw != expected


@pytest.mark.parametrize(
    "value,expected",
    [(1e21, b"1e+21"), (5e-324, b"5e-324"), (0.1, b"0.1"), (-1.5e300, b"-1.5e+300"), ({"a": 0.5}, b'{"a":0.5}')],
)
def test_floats_the_c_encoder_already_renders_right(value, expected):
    # These go through the fallback too (a float is always suspect) and must
    # come out the same.
    assert canonical_bytes(value) == expected
    assert oracle(value) == expected


def test_fast_path_detector_is_what_saves_these(monkeypatch):
    """Each route to the C encoder has a detector; disable it and the fast path
    produces wrong bytes, so the fallback cases really exercise the detector."""
    # Parsed values with unknown flags: the output scan.
    monkeypatch.setattr(canonical, "_suspect", lambda text: False)
    wrong = [v for v, expected in FALLBACK_CASES if canonical_bytes(v, parsed=True) != expected]
    assert len(wrong) == len(FALLBACK_CASES)
    # Caller-built values: the walk. Its fast encoder (orjson) happens to write two of
    # the floats as JCS does (1e-7, 0.00001); every other case it gets wrong.
    monkeypatch.setattr(canonical, "_inspect", lambda value: False)
    right = [v for v, expected in FALLBACK_CASES if canonical_bytes(v) == expected]
    assert right == [1e-7, {"x": 1e-5}]
    # Parsed values with flags: the parser hooks.
    monkeypatch.setattr(canonical, "_suspect", lambda text: False)
    for v, expected in FALLBACK_CASES:
        obj, careful = canonical.loads_flagged(json.dumps(v, ensure_ascii=False))
        assert careful, v
        assert canonical_bytes(obj, parsed=True, careful=careful) == expected


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_parse_flags_route_matches_rfc8785(value):
    """The reader's route: parse with flags, serialise trusting them."""
    try:
        expected = oracle(value)
    except Exception:
        return
    for text in (json.dumps(value, ensure_ascii=False), json.dumps(value)):
        obj, careful = canonical.loads_flagged(text)
        assert canonical_bytes(obj, parsed=True, careful=careful) == expected


@pytest.mark.parametrize(
    "value,expected",
    [
        (None, b"null"),
        (True, b"true"),
        (False, b"false"),
        (0, b"0"),
        (-1, b"-1"),
        (SAFE, b"9007199254740991"),
        (-SAFE, b"-9007199254740991"),
        (2**53, b"9007199254740992"),
        (1152921504606847000, b"1152921504606847000"),
        ("", b'""'),
        ('"\\/', b'"\\"\\\\/"'),
        ("\b\f\n\r\t", b'"\\b\\f\\n\\r\\t"'),
        ("\x00\x01\x1f\x7f", b'"\\u0000\\u0001\\u001f\x7f"'),
        ("\u2028\u2029", '"\u2028\u2029"'.encode()),
        ("\U0001f600", b'"\xf0\x9f\x98\x80"'),
        ("\ud83d\ude00".encode("utf-16", "surrogatepass").decode("utf-16"), b'"\xf0\x9f\x98\x80"'),
        ([], b"[]"),
        ({}, b"{}"),
        ((1, "a"), b'[1,"a"]'),
        ({"b": [1, {"d": None, "c": False}], "a": 0.5}, b'{"a":0.5,"b":[1,{"c":false,"d":null}]}'),
        ({"a": "x:1234567890123456"}, b'{"a":"x:1234567890123456"}'),  # false alarm, still right
        ({"1e5": "[1.5"}, b'{"1e5":"[1.5"}'),
        (1000000000000000, b"1000000000000000"),  # 16 digits below 2**53
    ],
)
def test_explicit_values(value, expected):
    assert canonical_bytes(value) == expected
    assert canonical_str_reference(value).encode() == expected


def test_subclasses_render_as_their_base_type():
    class F(float):
        def __repr__(self):
            return "F!"

    class Int(int):
        def __str__(self):
            return "I!"

        __repr__ = __str__

    class S(str):
        pass

    value = {S("k"): [F(0.5), Int(3), F(1e21), Int(2**60)]}
    assert canonical_bytes(value) == b'{"k":[0.5,3,1e+21,1152921504606847000]}'
    assert canonical_str_reference(value) == '{"k":[0.5,3,1e+21,1152921504606847000]}'


# --------------------------------------------------------------------------
# Whole numbers


@pytest.mark.parametrize(
    "n",
    [9007199254740993, -9007199254740993, 2**53 + 1, 2**60 + 1, 1152921504606846977,
     1152921504606847001, 10**400, -(10**400), 2**1024],
)
def test_whole_number_rule_refuses_ints(n):
    with pytest.raises(IJSONError):
        canonical_bytes(n)
    with pytest.raises(IJSONError):
        canonical_bytes({"a": [n]})
    with pytest.raises(IJSONError):
        canonical_str_reference(n)


def test_whole_number_beyond_int_str_limit_is_an_ijson_error():
    # str() of such an int raises ValueError; the message must not need it.
    with pytest.raises(IJSONError, match="not finite"):
        canonical_bytes(10**5000)


@pytest.mark.parametrize(
    "n,text",
    [
        (2**53, "9007199254740992"),
        (2**53 + 2, "9007199254740994"),
        (10**20, "100000000000000000000"),
        (2**60, "1152921504606847000"),
        (1152921504606847000, "1152921504606847000"),
        (10**21, "1e+21"),
        (2**1023, "8.98846567431158e+307"),
    ],
)
def test_whole_number_rule_admits_ints(n, text):
    assert canonical_bytes(n) == text.encode()
    assert canonical_bytes(-n) == ("-" + text).encode()
    assert check_whole_number(n) == float(n)


def admitted(n: int) -> bool:
    """RFC 0001's rule, computed with rfc8785 as the renderer."""
    try:
        f = float(n)
    except OverflowError:
        return False
    if int(f) == n:
        return True
    return Decimal(rfc8785.dumps(f).decode()) == n


def spellings(n: int) -> list[str]:
    digits = str(abs(n))
    sign = "-" if n < 0 else ""
    return [
        f"{sign}{digits}",
        f"{sign}{digits}.0",
        f"{sign}{digits}.000",
        f"{sign}{digits}0e-1",
        f"{sign}{digits[0]}.{digits[1:]}e{len(digits) - 1}",
        f"{sign}{digits[0]}.{digits[1:]}E+{len(digits) - 1}",
        f"{sign}0.{digits}e{len(digits)}",
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.integers(2**53 - 3, 2**53 + 3),
        st.integers(2**53, 2**75),
        big_ok_ints.map(abs),
        big_ok_ints.map(lambda n: abs(n) + 1),
        big_ok_ints.map(lambda n: abs(n) - 1),
    ),
    st.booleans(),
)
@example(9007199254740993, False)
@example(9007199254740992, False)
@example(1152921504606847000, True)
def test_whole_number_rule_is_by_value_not_spelling(n, neg):
    if neg:
        n = -n
    ok = admitted(n)
    for text in spellings(n):
        if ok:
            value = loads(text)
            assert canonical_bytes(value) == rfc8785.dumps(float(n)), text
            assert canonical_bytes({"v": value}) == b'{"v":' + rfc8785.dumps(float(n)) + b"}"
        else:
            with pytest.raises(IJSONError):
                canonical_bytes(loads(text), parsed=True)
            with pytest.raises(IJSONError):
                canonical_bytes(loads("[{\"v\":" + text + "}]"), parsed=True)


# --------------------------------------------------------------------------
# loads: I-JSON


@pytest.mark.parametrize(
    "text",
    [
        '{"a":1,"a":1}',
        '{"a":1,"b":2,"a":3}',
        '[{"x":{"y":[{"k":1,"k":2}]}}]',
        '{"a":{"b":1},"c":{"d":1,"d":1}}',
        '{"\\u0061":1,"a":2}',  # the same name, spelled two ways
        '{"\\ud83d\\ude00":1,"\U0001f600":2}',
    ],
)
def test_loads_refuses_repeated_member_names(text):
    assert isinstance(json.loads(text), (dict, list))  # json.loads keeps the last
    with pytest.raises(IJSONError, match="repeated"):
        loads(text)
    with pytest.raises(IJSONError):
        loads(text.encode("utf-8"))


def test_loads_keeps_names_that_differ():
    assert loads('{"a":1,"A":2,"a ":3}') == {"a": 1, "A": 2, "a ": 3}
    assert loads('[{"a":1},{"a":2}]') == [{"a": 1}, {"a": 2}]


@pytest.mark.parametrize(
    "text",
    ["NaN", "Infinity", "-Infinity", "[NaN]", '{"a":Infinity}', '{"a":[1,-Infinity]}',
     "1e400", "-1e400", "[1E309]", '{"x":1.8e308}', "1" * 400 + ".5", "1" * 5000, "-" + "9" * 5000],
)
def test_loads_refuses_non_finite(text):
    with pytest.raises(IJSONError):
        loads(text)


@pytest.mark.parametrize(
    "text",
    ["9007199254740993.0", "9.007199254740993e15", "90071992547409930e-1", "-9007199254740993.0",
     "[9.007199254740993E+15]", '{"a":{"b":9007199254740993.00}}'],
)
def test_loads_refuses_inexact_whole_float_spellings(text):
    with pytest.raises(IJSONError):
        loads(text)


@pytest.mark.parametrize("text", ["9007199254740993", "-9007199254740993", '{"a":[9007199254740993]}'])
def test_inexact_whole_int_refused_when_hashed(text):
    value = loads(text)  # an int: kept exact by the parser ...
    with pytest.raises(IJSONError):
        canonical_bytes(value, parsed=True)  # ... and refused as a value


@pytest.mark.parametrize(
    "text,expected",
    [
        ("9007199254740992", b"9007199254740992"),
        ("9007199254740992.0", b"9007199254740992"),
        ("9.007199254740992e15", b"9007199254740992"),
        ("1e20", b"100000000000000000000"),
        ("100000000000000000000", b"100000000000000000000"),
        ("0.1", b"0.1"),
        ("1152921504606847000", b"1152921504606847000"),
        ("1.152921504606847e18", b"1152921504606847000"),
        ("1152921504606846976", b"1152921504606847000"),
        ("1e-400", b"0"),  # rounding to binary64 is expected, not an error
        ("-0", b"0"),
        ("-0.0", b"0"),
        ("9007199254740992.5", b"9007199254740992"),  # not a whole number
        ("9007199254740993.5", b"9007199254740994"),
        ("1.7976931348623157e308", b"1.7976931348623157e+308"),
        ('"\\ud83d\\ude00"', b'"\xf0\x9f\x98\x80"'),
        ('{"b":1,"a":[true,false,null]}', b'{"a":[true,false,null],"b":1}'),
    ],
)
def test_loads_accepts(text, expected):
    assert canonical_bytes(loads(text), parsed=True) == expected
    assert canonical_bytes(loads(text.encode()), parsed=True) == expected


@pytest.mark.parametrize("text", ["", "{", '{"a":1', "[1,]", "{'a':1}", "01", "+1", ".5", "tru", '"\x01"'])
def test_loads_syntax_errors_are_json_errors(text):
    with pytest.raises(json.JSONDecodeError):
        loads(text)
    # and not confused with an I-JSON refusal
    try:
        loads(text)
    except IJSONError:  # pragma: no cover - the assertion below fails
        pytest.fail("syntax error reported as IJSONError")
    except ValueError:
        pass


def test_loads_bytes_must_be_utf8():
    with pytest.raises(UnicodeDecodeError):
        loads(b'"\xff"')
    assert loads('"\u00e9"'.encode()) == "\u00e9"
    assert loads(bytearray(b"[1]")) == [1]


def test_loads_keeps_ints_exact():
    assert loads("9007199254740993") == 9007199254740993
    assert type(loads("1")) is int
    assert type(loads("1.0")) is float


# --------------------------------------------------------------------------
# Strings: lone surrogates


@pytest.mark.parametrize(
    "value",
    ["\ud83d", "\ude00", "a\ud800b", ["ok", "\udfff"], {"k": "\ud83d"}, {"\ud83d": 1},
     {"a": [{"b": "x\udc00"}]}, "\ude00\ud83d"],
)
def test_lone_surrogates_refused(value):
    with pytest.raises(IJSONError, match="surrogate"):
        canonical_bytes(value)
    with pytest.raises(IJSONError):
        canonical_bytes(value, parsed=True)


@pytest.mark.parametrize("text", ['"\\ud83d"', '"\\ude00"', '{"\\ud83d":1}', '["\\ud83d x"]', '"\\ude00\\ud83d"'])
def test_escaped_lone_surrogate_parses_then_refused(text):
    value = loads(text)  # JSON admits it ...
    with pytest.raises(IJSONError, match="surrogate"):
        canonical_bytes(value, parsed=True)  # ... I-JSON does not


def test_surrogate_pair_escape_is_fine():
    assert canonical_bytes(loads('"\\ud83d\\ude00"'), parsed=True) == '"\U0001f600"'.encode()
    assert canonical_bytes(loads('{"\\ud83d\\ude00":"\\uD83D\\uDE00"}'), parsed=True) == (
        '{"\U0001f600":"\U0001f600"}'.encode()
    )


# --------------------------------------------------------------------------
# Things that are not JSON


@pytest.mark.parametrize(
    "value",
    [{1: 2}, {None: 1}, {True: 1}, {1.5: 1}, {("a",): 1}, [{"a": {2: 3}}], {"a": ({"b": {0: 0}},)},
     {"a": 1, 2: "b"}],
)
def test_non_string_member_names_refused(value):
    with pytest.raises(IJSONError, match="member name"):
        canonical_bytes(value)
    with pytest.raises(IJSONError):
        canonical_str_reference(value)


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), -float("inf"), [float("nan")], {"a": float("inf")}, {1, 2}, b"x",
     Decimal("1"), object(), {"a": [frozenset()]}, 1j],
)
def test_non_json_values_refused(value):
    with pytest.raises(IJSONError):
        canonical_bytes(value)
    with pytest.raises(IJSONError):
        canonical_str_reference(value)


def test_number_to_json_refuses_non_finite():
    for f in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(IJSONError):
            number_to_json(f)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(member_names, safe_ints), max_size=8, unique_by=lambda t: t[0]))
def test_member_order_is_utf16(pairs):
    """Independent of rfc8785: names come out in UTF-16 code unit order."""
    random.Random(0).shuffle(pairs)
    out = json.loads(canonical_bytes(dict(pairs)))
    names = list(out)
    assert names == sorted((k for k, _ in pairs), key=lambda k: k.encode("utf-16-be"))


def test_escaped_astral_member_name_in_ascii_text_is_sorted_by_utf16():
    """An all-ASCII line can still spell a supplementary-plane name with escapes."""
    text = '{"\\ue000":1,"\\ud800\\udc00":2}'
    obj, careful = canonical.loads_flagged(text)
    assert careful
    assert canonical_bytes(obj, parsed=True, careful=careful) == '{"\U00010000":2,"\ue000":1}'.encode()


def test_ascii_text_without_astral_names_is_not_flagged():
    obj, careful = canonical.loads_flagged('{"a":"\\u00e9\\ud83d\\ude00","b":[1,2,{"c":null}]}')
    assert careful is False  # the astral character is in a value, where order does not matter
    assert canonical_bytes(obj, parsed=True, careful=careful) == rfc8785.dumps(obj)


# --------------------------------------------------------------------------
# loads_canonical: orjson's parse where a round trip proves it the strict parse's


def _same(a, b) -> bool:
    """Equal, type for type and member order included (``1 == 1.0`` and ``True == 1`` are not)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _outcome(fn, raw):
    try:
        return "ok", fn(raw)
    except (ValueError, RecursionError) as exc:  # IJSONError, JSONDecodeError, UnicodeDecodeError
        return type(exc), str(exc)


def _agrees_with_strict(raw: bytes) -> bool:
    """loads_canonical(raw) gives what loads_flagged(raw) gives, or raises as it raises;
    and a line it calls canonical is RFC 8785's bytes of its value. Returns whether
    the line was proven canonical."""
    mine, strict = _outcome(canonical.loads_canonical, raw), _outcome(canonical.loads_flagged, raw)
    if strict[0] != "ok":
        assert mine == strict
        return False
    assert mine[0] == "ok", (raw, mine)
    value, careful, proven = mine[1]
    assert _same(value, strict[1][0]) and careful == strict[1][1], raw
    if proven:
        assert careful is False
        assert canonical_str_reference(value).encode("utf-8") == raw
        assert oracle(value) == raw
    return proven


def _spellings(value) -> list[bytes]:
    """Lines that hold ``value``: its canonical form when it has one, orjson's sorted form,
    the standard library's (escaped, spaced, unsorted)."""
    import orjson

    out = [json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"), json.dumps(value).encode()]
    out.append(json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode("utf-8", "surrogatepass"))
    try:
        out.append(oracle(value))
    except Exception:
        pass
    try:
        out.append(orjson.dumps(value, option=orjson.OPT_SORT_KEYS))
    except (TypeError, orjson.JSONEncodeError):
        pass
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(member_names, json_values, max_size=6))
def test_loads_canonical_agrees_with_the_strict_parse(value):
    for raw in _spellings(value):
        _agrees_with_strict(raw)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(st.sampled_from("ab\u00e9"), max_size=3), st.one_of(st.none(), safe_ints, strings), min_size=1, max_size=5))
def test_loads_canonical_proves_plain_canonical_lines(value):
    """A line in RFC 8785's form holding no float, long integer or supplementary-plane name
    is proven canonical (the fast path is taken), and a member repeated in it is refused
    as the strict parse refuses it."""
    raw = oracle(value)
    if all(-(10**14) < v < 10**15 for v in value.values() if type(v) is int) and not any(
        ord(c) > 0xFFFF for k in value for c in k
    ):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return
        assert _agrees_with_strict(raw)
    name = next(iter(value))
    repeated = raw[:-1] + b"," + json.dumps(name, ensure_ascii=False).encode() + b":null}"
    assert not _agrees_with_strict(repeated)


@pytest.mark.parametrize(
    "raw,proven",
    [
        (b'{"a":1,"b":[true,false,null],"c":{"d":"e"}}', True),
        (b'{"a":1,"a":1}', False),  # repeated: orjson keeps one, and its encoding is shorter
        (b'{"a":1,"a":2}', False),
        (b'{"a":1.0}', False),  # a float: JCS writes 1, orjson 1.0
        (b'{"a":0.5}', False),  # any float: the strict parse flags it careful
        (b'{"a":1e16}', False),
        (b'{"a":999999999999999}', True),  # 15 digits: not flagged
        (b'{"a":1000000000000000}', False),  # 16: flagged careful
        (b'{"a":-99999999999999}', True),
        (b'{"a":-100000000000000}', False),  # 16 characters with the sign
        (b'{"a":9007199254740993}', False),  # the whole-number rule's
        (b'{"a":123456789012345678901234567890}', False),  # beyond 64 bits
        (b'{"a":-0}', False),
        (b'{"a":"\\u00e9"}', False),  # an escape orjson writes as the character
        (b'{"a":"\\ud800"}', False),  # a lone surrogate: refused when encoded, not parsed
        (b'{"a":"\\/"}', False),
        (b'{"a":"\\u001f","b":"\\n"}', True),  # JCS's escapes are orjson's
        (b'{"a": 1}', False),
        (b'{"b":1,"a":2}', False),  # out of order
        (b' {"a":1}', False),
        (b'{"a":1}\r', False),
        ('{"\U0001f600":1,"\ue000":2}'.encode(), False),  # code point order, not UTF-16's
        ('{"\ue000":2,"\U0001f600":1}'.encode(), False),  # UTF-16 order, which orjson does not write
        ('{"a":"\U0001f600"}'.encode(), True),  # a supplementary character in a value is plain
        ('{"\u00e9":"\u00e9"}'.encode(), True),
        (b'{"a":"\xff"}', False),  # not UTF-8
        (b'[1,2]', False),  # not an object
        (b'"a"', False),
        (b'{"a":NaN}', False),
        (b'{"a":', False),
        (b"", False),
        (b'{"a":' * 300 + b"1" + b"}" * 300, False),  # past orjson's encoding depth
        (b'{"a":[' * 600 + b"]}" * 600, False),  # past orjson's parsing depth
    ],
)
def test_loads_canonical_takes_only_what_it_proves(raw, proven):
    assert _agrees_with_strict(raw) is proven


# --------------------------------------------------------------------------
# Nesting: refused at one depth, with the stack left to whatever else runs


DEEP = 100_000


@pytest.mark.parametrize("parse", ["loads", "loads_canonical", "loads_flagged"])
def test_a_deep_value_is_refused_at_the_one_depth_and_leaves_the_stack(parse):
    fn = getattr(canonical, parse)
    text = b'{"item":' + b"[" * DEEP + b"]" * DEEP + b"}"

    def work() -> None:
        with pytest.raises(IJSONError, match=f"nested more than {canonical.MAX_DEPTH} deep"):
            fn(text)

    assert short_of_stack(work) == []
    # The bound is the same wherever the parse is called from, and the value at it is read.
    at = canonical.MAX_DEPTH - 1  # (the object holding the array is one level)
    assert fn(b'{"item":' + b"[" * at + b"]" * at + b"}") is not None
    with pytest.raises(IJSONError, match="nested more than"):
        fn(b'{"item":' + b"[" * (at + 1) + b"]" * (at + 1) + b"}")
    # Brackets inside strings are text, not nesting.
    assert fn(json.dumps({"s": "[" * DEEP, "t": "{\\\"" * 1000}).encode()) is not None


def test_a_deep_value_built_by_a_caller_is_refused_by_canonical_bytes():
    value: list = []
    for _ in range(DEEP // 10):
        value = [value]
    # Built by a caller, or parsed by orjson (which parses 1024 levels) and known plain.
    for parsed in (False, True):
        def work(parsed=parsed) -> None:  # type: ignore[no-untyped-def]
            with pytest.raises(IJSONError, match=f"nested more than {canonical.MAX_DEPTH} deep"):
                canonical_bytes(value, parsed=parsed, careful=False if parsed else None)
        assert short_of_stack(work) == []
    at: list = []
    for _ in range(canonical.MAX_DEPTH - 1):
        at = [at]
    assert canonical_bytes(at) == b"[" * canonical.MAX_DEPTH + b"]" * canonical.MAX_DEPTH
    with pytest.raises(IJSONError, match="nested more than"):
        canonical_bytes([at])
