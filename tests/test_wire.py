"""The framing of many objects in one body (exchange/wire.py), which a batch upload and a
batch read share: each frame whole however the bytes arrive, a cut answer never a
short one, a server's failure part way raised as the error it names."""

from __future__ import annotations

import pytest

from agentsession_cas.errors import BadNameError, NoSuchSessionError, TooLargeError, TransportError
from agentsession_cas.exchange.wire import FrameReader, end_frame, error_frame, object_frame, parse_frames
from agentsession_cas.format.hashing import sha256_ref

A, B = b'{"a":1}', b'{"b":"two\nlines"}'
OBJS = [("contents", sha256_ref(A), A), ("blobs", sha256_ref(B), B)]
BODY = b"".join(object_frame(*o) for o in OBJS)


def test_a_body_of_frames_parses_back_to_its_objects():
    assert BODY.startswith(b"contents sha256:") and b"}media sha256:" in BODY  # the wire's name of a blob
    assert parse_frames(BODY, 1 << 20) == OBJS
    with pytest.raises(BadNameError, match="cut short"):
        parse_frames(BODY[:-1], 1 << 20)
    with pytest.raises(TooLargeError):
        parse_frames(BODY, 3)
    with pytest.raises(BadNameError, match="frame 0"):
        parse_frames(b"contents nothing 3\nabc", 1 << 20)


@pytest.mark.parametrize("step", [1, 7, len(BODY) + 9])
def test_a_streamed_answer_yields_each_object_whole_however_it_is_cut(step):
    data = BODY + end_frame(2)
    reader = FrameReader(where="remote x", max_object=1 << 20)
    got = [o for i in range(0, len(data), step) for o in reader.feed(data[i : i + step])]
    assert got == OBJS and reader.ended and reader.count == 2


def test_an_answer_without_its_end_is_not_ended_and_a_wrong_end_is_refused():
    reader = FrameReader(where="remote x", max_object=1 << 20)
    assert list(reader.feed(BODY)) == OBJS and not reader.ended
    with pytest.raises(TransportError, match="end frame"):
        list(FrameReader(where="remote x", max_object=1 << 20).feed(BODY + end_frame(3)))
    with pytest.raises(TransportError, match="end frame"):
        list(FrameReader(where="remote x", max_object=1 << 20).feed(BODY + end_frame(2) + b"more"))
    with pytest.raises(TransportError, match="remote x"):
        list(FrameReader(where="remote x", max_object=1 << 20).feed(b"x" * 300))


def test_an_error_frame_raises_the_error_it_names():
    reader = FrameReader(where="remote x", max_object=1 << 20)
    data = object_frame(*OBJS[0]) + error_frame(NoSuchSessionError("no session s1 here"))
    got = []
    with pytest.raises(NoSuchSessionError, match="no session s1 here"):
        for i in range(0, len(data), 5):
            got.extend(reader.feed(data[i : i + 5]))
    assert got == OBJS[:1]
