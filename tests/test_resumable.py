"""A SHA-256 whose running state is written down and taken up again
(agentsession_cas/format/resumable.py): what the kept rules' state carries of a
request hash in progress (issue 11)."""

from __future__ import annotations

import hashlib
import json

import pytest

from agentsession_cas.format import resumable

pytestmark = pytest.mark.skipif(not resumable.available(), reason="this machine's SHA-256 state cannot be read")

DATA = bytes(range(256)) * 5 + b"tail"


@pytest.mark.parametrize("cut", [0, 1, 55, 63, 64, 65, 127, 128, 200, 640, len(DATA)])
def test_a_state_written_down_and_taken_up_hashes_as_hashlib(cut):
    h = resumable.new()
    h.update(DATA[:cut])
    state = json.loads(json.dumps(resumable.state_of(h)))  # (what a file holds)
    assert state["n"] == cut and len(state["tail"]) == 2 * (cut % 64)
    again = resumable.load_state(state)
    again.update(DATA[cut:])
    assert again.hexdigest() == hashlib.sha256(DATA).hexdigest()
    assert h.hexdigest() == hashlib.sha256(DATA[:cut]).hexdigest()  # (a digest leaves the state as it was)
    h.update(DATA[cut:])
    assert h.hexdigest() == hashlib.sha256(DATA).hexdigest()


def test_a_copy_goes_on_alone():
    h = resumable.new()
    h.update(b"abc")
    c = h.copy()
    c.update(b"def")
    assert h.hexdigest() == hashlib.sha256(b"abc").hexdigest()
    assert c.hexdigest() == hashlib.sha256(b"abcdef").hexdigest()


@pytest.mark.parametrize(
    "bad",
    [
        None, [], {"h": "0" * 64, "n": 0}, {"h": "0" * 64, "n": 0, "tail": "", "x": 1},
        {"h": "0" * 63, "n": 0, "tail": ""}, {"h": "G" * 64, "n": 0, "tail": ""}, {"h": "A" * 64, "n": 0, "tail": ""},
        {"h": " " + "0" * 63, "n": 0, "tail": ""}, {"h": "0" * 64, "n": -1, "tail": ""},
        {"h": "0" * 64, "n": True, "tail": ""}, {"h": "0" * 64, "n": 1.0, "tail": "00"},
        {"h": "0" * 64, "n": 1, "tail": ""}, {"h": "0" * 64, "n": 2, "tail": "0 00"}, {"h": "0" * 64, "n": 65, "tail": "00" * 65},
    ],
)
def test_a_state_not_of_the_form_is_refused(bad):
    with pytest.raises(ValueError):
        resumable.load_state(bad)


def test_a_hashlib_hash_has_no_state_and_a_machine_without_it_takes_none_up(monkeypatch):
    assert resumable.state_of(hashlib.sha256()) is None
    state = resumable.state_of(resumable.new())
    monkeypatch.setenv("AGENTSESSION_RESUMABLE_SHA256", "0")
    monkeypatch.setattr(resumable, "_lib", resumable._NOT_LOADED)
    assert not resumable.available()
    h = resumable.new()
    h.update(b"abc")
    assert resumable.state_of(h) is None and h.hexdigest() == hashlib.sha256(b"abc").hexdigest()
    with pytest.raises(ValueError):
        resumable.load_state(state)
