"""Serving the application: a listening socket, uvicorn, and the store closed after.

``serve`` binds the socket itself (so ``--listen 127.0.0.1:0`` picks a free
port and says which), refuses a non-loopback address without what RFC 0003
requires there (:func:`tls_mode`: tokens, and TLS of its own or at a proxy the
operator names), ends every open follow stream as it begins to stop (an ``end`` event,
reason ``shutdown``: uvicorn's graceful shutdown waits for open responses), and closes
the store when uvicorn stops (SIGINT or SIGTERM), which commits and checkpoints every
session it holds and keeps their summaries.
"""

from __future__ import annotations

import ipaddress
import signal
import socket
import threading
from collections.abc import Callable

import uvicorn

from ..errors import InsecureListenError, StoreError
from ..store.store import Store
from .app import Limits, ServerState, create_app
from .auth import Tokens

__all__ = ["TLS_MODES", "is_loopback", "parse_listen", "serve", "tls_mode"]

#: What the capabilities' ``tls`` says of each mode a server may run in.
TLS_MODES = {
    "server": "this server terminates TLS (--tls-cert, --tls-key)",
    "proxy": "plain HTTP here, TLS at a proxy in front (--behind-tls-proxy)",
    "none": "plain HTTP on loopback only",
}


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT (``[::1]:PORT`` for IPv6); StoreError naming what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise StoreError(f"--listen {text!r}: expected HOST:PORT (a port number up to 65535)")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host or "127.0.0.1", int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tls_mode(
    listen: str, *, tokens: Tokens | None, tls_cert: str | None = None, tls_key: str | None = None,
    behind_tls_proxy: bool = False,
) -> str:
    """The mode (a key of :data:`TLS_MODES`) a server listening on ``listen`` runs in, or
    InsecureListenError (nothing bound) where RFC 0003 forbids it: "A deployment MUST
    authenticate and authorize every request, over TLS". Beyond loopback a server needs
    tokens, and TLS: its own certificate, or the operator's word that a proxy in front
    terminates it (this server cannot see the proxy, so it takes that on trust and says
    so in its capabilities)."""
    host, _ = parse_listen(listen)
    if (tls_cert is None) != (tls_key is None):
        raise StoreError("--tls-cert and --tls-key go together")
    if behind_tls_proxy and tls_cert is not None:
        raise InsecureListenError(
            "--behind-tls-proxy says a proxy in front terminates TLS, --tls-cert that this server does: give one"
        )
    loopback = is_loopback(host)
    if tokens is None and not loopback:
        raise InsecureListenError(
            f"--listen {listen}: without --auth this server serves loopback only (127.0.0.1, ::1); "
            "give a token file to listen elsewhere"
        )
    if tls_cert is not None:
        return "server"
    if behind_tls_proxy:
        return "proxy"
    if not loopback:
        raise InsecureListenError(
            f"--listen {listen} is not loopback, and RFC 0003 requires TLS beyond it: add --tls-cert FILE "
            "--tls-key FILE to serve HTTPS, or --behind-tls-proxy if a proxy in front terminates TLS "
            "and forwards to this address"
        )
    return "none"


def serve(
    store: Store,
    *,
    listen: str = "127.0.0.1:8765",
    tokens: Tokens | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    behind_tls_proxy: bool = False,
    limits: Limits | None = None,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``store`` until interrupted; ``ready(url)`` is called once listening.
    InsecureListenError, before anything is bound, for an address :func:`tls_mode`
    refuses."""
    mode = tls_mode(listen, tokens=tokens, tls_cert=tls_cert, tls_key=tls_key, behind_tls_proxy=behind_tls_proxy)
    host, port = parse_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY on accepted connections only when
    # the socket says it is TCP, and without it every response (head and body written
    # apart) waits some 40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StoreError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    sock.listen(128)
    bound = sock.getsockname()[1]
    state = ServerState(store, tokens, limits or Limits(), tls=mode)
    config = uvicorn.Config(
        create_app(state), log_level="warning", lifespan="off", ssl_certfile=tls_cert, ssl_keyfile=tls_key,
        timeout_graceful_shutdown=5, access_log=False,
    )
    server = _Server(config, state)
    scheme = "https" if tls_cert else "http"
    shown = f"[{host}]" if ":" in host else host
    if ready is not None:
        ready(f"{scheme}://{shown}:{bound}/")
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again under the
    # handler it found: the default one would end the process before the store below is
    # closed (sessions not checkpointed, no summaries: every later open and list replays
    # their logs). This one ends it as an exception, so the store is closed first.
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        try:
            store.close()
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


class _Server(uvicorn.Server):
    """uvicorn's server, which ends every open follow stream as it begins to stop: its
    graceful shutdown waits for open responses (up to ``timeout_graceful_shutdown``, then
    cuts them), and a follow would otherwise run on to its age limit, idle."""

    def __init__(self, config: uvicorn.Config, state: ServerState):
        super().__init__(config)
        self.state = state

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.state.changes.close()  # each stream sends its end event (reason shutdown) and returns
        await super().shutdown(sockets)


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM, once uvicorn has stopped serving: exit as the shell reports a signal (143)."""
    raise SystemExit(128 + signum)
