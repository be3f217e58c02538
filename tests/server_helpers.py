"""A real server for tests: `agentsession serve` in its own process on a free loopback
port, talked to over HTTP with httpx. Nothing is mocked at the HTTP layer.

``ServerProcess`` binds port 0 (the server picks a free port and prints it), waits
for the "listening on URL" line, and stops the process with SIGTERM (or SIGKILL
when a test asks), so a test can also restart a server over the same store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentsession_cas.exchange.http_client import no_delay_transport
from agentsession_cas.store import Store

__all__ = ["ServerProcess", "served", "TOKENS", "token_file"]

#: Tokens the tests' auth files hold: a name -> (token, scopes, sessions prefix).
TOKENS: dict[str, tuple[str, list[str], str]] = {
    "all": ("t-all-0123456789abcdef", ["read", "write", "refs", "exchange", "admin"], ""),
    "reader": ("t-reader-0123456789abcdef", ["read"], ""),
    "writer": ("t-writer-0123456789abcdef", ["read", "write"], ""),
    "pusher": ("t-pusher-0123456789abcdef", ["exchange"], ""),
    "team-a": ("t-team-a-0123456789abcdef", ["read", "write", "exchange", "refs"], "a-"),
    "team-b": ("t-team-b-0123456789abcdef", ["read", "write", "exchange", "refs"], "b-"),
    "nobody": ("t-nobody-0123456789abcdef", [], ""),
}


def token_file(directory: Path) -> Path:
    path = directory / "tokens.json"
    path.write_text(json.dumps({"tokens": [
        {"token": t, "scopes": s, "sessions": p, "name": n} for n, (t, s, p) in TOKENS.items()
    ]}))
    return path


class ServerProcess:
    """One `agentsession serve` process over a store directory."""

    def __init__(self, store: Path, *, auth: Path | None = None, extra: tuple[str, ...] = ()):
        self.store = store
        self.auth = auth
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.stderr: list[bytes] = []

    def start(self) -> ServerProcess:
        args = [sys.executable, "-m", "agentsession_cas", "--store", str(self.store), "serve", "--listen", "127.0.0.1:0",
                *self.extra]
        if self.auth is not None:
            args += ["--auth", str(self.auth)]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        err = self.proc.stderr
        threading.Thread(target=lambda: self.stderr.extend(iter(err.readline, b"")), daemon=True).start()
        line = self.proc.stdout.readline().decode()  # blocks until listening, or EOF if it failed
        if not line.startswith("listening on "):
            self.proc.wait(timeout=30)
            raise RuntimeError(f"the server did not start: {line!r} {b''.join(self.stderr).decode()}")
        self.url = line.split()[-1]
        return self

    def client(self, token: str | None = None, *, bearer: str | None = None, **kwargs: Any) -> httpx.Client:
        """An httpx client of the server, with one of :data:`TOKENS` (by name) or a bearer token."""
        bearer = TOKENS[token][0] if token else bearer
        headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        kwargs.setdefault("transport", no_delay_transport())
        return httpx.Client(base_url=self.url.rstrip("/"), headers=headers, timeout=60, **kwargs)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        self.proc = None
        return code

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server over a new file store, with the tests' token file; an append is durable
    when it asks (``?commit=true``), else lazy (``--sync never``)."""
    Store.init(tmp_path / "served").close()
    with ServerProcess(tmp_path / "served", auth=token_file(tmp_path), extra=("--sync", "never")) as server:
        yield server
