"""SIGTERM ends a command as Ctrl-C does: what it was writing is let go (an import's
stage and partial pack removed from the store's tmp/), and it exits 143 (128 + SIGTERM)
with no traceback. Forced, not timed: the import is stopped where it waits, opening a
sidecar blob that is a FIFO no one writes yet, after its pack is written to tmp/."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agentsession_cas import Header
from agentsession_cas.store import Store

EXE = Path(sys.executable).parent / "agentsession"
ENTRIES = 3000


def _reading_fifo(fifo: Path) -> bool:
    """A reader has the FIFO open (or is opening it): a writer's non-blocking open
    succeeds only then. The writer end is kept open, so the reader waits for data."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    _held.append(fd)
    return True


_held: list[int] = []


def test_sigterm_during_an_import_leaves_no_temporary_file_and_exits_143(tmp_path):
    src = tmp_path / "src"
    with Store.init(src) as st:
        blob = st.put_blob(b"\x89PNG not really an image")
        s = st.create(Header.new("big", media="sidecar"))
        for i in range(ENTRIES):
            s.append({"type": "item", "item": {"type": "message", "role": "user", "content": f"turn {i} " + "x" * 200},
                      "ts": f"2026-12-04T02:{(i // 60) % 60:02d}:{i % 60:02d}.{i + 1:06d}1Z"}, durable=False)
        image = {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": f"sidecar:{blob}"}]}
        s.append({"type": "item", "item": image, "ts": "2026-12-04T03:00:00Z"})
        s.close()
        st.export_to("big", tmp_path / "big.jsonl")
    blob_file = tmp_path / "big" / blob[len("sha256:"):]
    assert blob_file.is_file()
    blob_file.unlink()
    os.mkfifo(blob_file)  # the import opens it after its objects are in a pack in tmp/, and waits there

    store = tmp_path / "store"
    Store.init(store).close()
    p = subprocess.Popen([str(EXE), "--store", str(store), "import", str(tmp_path / "big.jsonl")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        while not _reading_fifo(blob_file):
            assert p.poll() is None, p.communicate()
            time.sleep(0.01)  # (polling a state the import waits in: not a timing)
        staged = [os.path.join(d, f) for d, _, fs in os.walk(store / "tmp") for f in fs]
        assert any(f.endswith(".pack") for f in staged), staged  # the partial pack the import wrote
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=120)
    finally:
        for fd in _held:
            os.close(fd)
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 143, (out, err)
    assert b"Traceback" not in err, err
    assert [os.path.join(d, f) for d, _, fs in os.walk(store / "tmp") for f in fs] == []
    assert os.listdir(store / "tmp") == []
    assert Store(store, readonly=True).list() == []  # nothing imported
