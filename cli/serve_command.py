"""serve: the store over HTTP (RFC 0003), for other machines to push to, fetch from and follow."""

from __future__ import annotations

import sys
from dataclasses import replace

import click

from agentsession_cas.errors import UnsupportedError
from agentsession_cas.store.url import open_store

from .common import Parsed, fail
from .store_commands import store_root


def _listen(text: str) -> str:
    """``--listen`` judged by the server's one reading of it; without the server's extra
    it passes, and ``serve`` says which extra to install."""
    try:
        from agentsession_cas.server.run import parse_listen
    except ImportError:
        return text
    parse_listen(text)
    return text


@click.command("serve")
@click.option("--listen", type=Parsed("address", _listen), default="127.0.0.1:8765", show_default=True, metavar="HOST:PORT",
              help="Where to listen; port 0 picks a free one (the first line printed names it).")
@click.option("--auth", "auth_file", metavar="FILE",
              help='Bearer tokens: {"tokens": [{"token", "scopes", "sessions"?}]}. Without it: loopback only.')
@click.option("--tls-cert", metavar="FILE", help="Serve HTTPS with this certificate (PEM), with --tls-key.")
@click.option("--tls-key", metavar="FILE", help="The certificate's private key (PEM).")
@click.option("--behind-tls-proxy", "behind_tls_proxy", is_flag=True,
              help="A proxy in front terminates TLS and forwards here: serve plain HTTP beyond loopback (with --auth).")
@click.option("--sync", type=click.Choice(["always", "responses", "never"]), default="always", show_default=True,
              help="When an append made through the server is durable before it answers (the store's policy).")
@click.option("--read-only", "read_only", is_flag=True, help="Serve the store read-only: every write is refused (read_only).")
@click.option("--max-body-bytes", type=click.IntRange(min=1024), default=None, metavar="N",
              help="The largest request body taken (default 256 MiB; objects at most 64 MiB or N).")
@click.option("--max-streams", type=click.IntRange(min=1), default=None, metavar="N",
              help="The most follow streams open at once (default 256); past it a follow is 503.")
@click.option("--max-stream-age", type=click.IntRange(min=1), default=None, metavar="SECONDS",
              help="How long a follow stream lives (default 3600) before it ends with an end event to resume from.")
@click.option("--max-idempotency-keys", type=click.IntRange(min=1), default=None, metavar="N",
              help="The most Idempotency-Key answers kept at once (default 500000, each 20 min); past it a keyed write is 503.")
@click.option("--max-idempotency-keys-per-token", type=click.IntRange(min=1), default=None, metavar="N",
              help="The most of them one token's keys hold at once (default a quarter of the total); past it its keyed writes are 503.")
@click.option("--max-resume-records", type=click.IntRange(min=1), default=None, metavar="N",
              help="The most log records a follow resumes across (default: no bound); further behind, it is sent a reset.")
def serve(
    listen: str, auth_file: str | None, tls_cert: str | None, tls_key: str | None, behind_tls_proxy: bool, sync: str,
    read_only: bool, max_body_bytes: int | None, max_streams: int | None, max_stream_age: int | None,
    max_idempotency_keys: int | None, max_idempotency_keys_per_token: int | None, max_resume_records: int | None,
) -> None:
    """Serve the store over HTTP (RFC 0003) until interrupted.

    Prints `listening on URL` once it accepts connections. Without --auth it
    listens on loopback only and every caller may do everything; with it,
    every request needs a bearer token from FILE and the token's scopes.
    Beyond loopback it also needs TLS (RFC 0003): --tls-cert and --tls-key,
    or --behind-tls-proxy where a proxy in front terminates it.
    """
    try:
        from agentsession_cas.server.app import Limits
        from agentsession_cas.server.auth import load_tokens
        from agentsession_cas.server.run import TLS_MODES, tls_mode
        from agentsession_cas.server.run import serve as run
    except ImportError as exc:
        fail(f"the server needs its extra: pip install 'agentsession-cas[server]' ({exc})", code=UnsupportedError.code)
    tokens = load_tokens(auth_file) if auth_file else None
    # Refused before the store is opened; serve() asks the same function again.
    mode = tls_mode(listen, tokens=tokens, tls_cert=tls_cert, tls_key=tls_key, behind_tls_proxy=behind_tls_proxy)
    store = open_store(store_root(), sync=sync, readonly=read_only)

    def ready(url: str) -> None:
        auth = "bearer tokens" if tokens is not None else "none: loopback only"
        click.echo(f"listening on {url}", file=sys.stdout)
        click.echo(f"agentsession: serving {store.describe()} (auth: {auth}; {TLS_MODES[mode]})", err=True)
        sys.stdout.flush()

    limits = Limits()
    if max_body_bytes is not None:
        limits = replace(limits, max_body_bytes=max_body_bytes,
                         max_object_bytes=min(max_body_bytes, limits.max_object_bytes))
    if max_streams is not None:
        limits = replace(limits, max_streams=max_streams)
    if max_stream_age is not None:
        limits = replace(limits, max_stream_age_s=max_stream_age)
    if max_idempotency_keys is not None:
        limits = replace(limits, idempotency_keys=max_idempotency_keys)
    if max_idempotency_keys_per_token is not None:
        limits = replace(limits, idempotency_keys_per_token=max_idempotency_keys_per_token)
    if max_resume_records is not None:
        limits = replace(limits, max_resume_records=max_resume_records)
    run(store, listen=listen, tokens=tokens, tls_cert=tls_cert, tls_key=tls_key, behind_tls_proxy=behind_tls_proxy,
        limits=limits, ready=ready)


COMMANDS: list[click.Command] = [serve]
