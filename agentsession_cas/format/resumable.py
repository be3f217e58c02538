"""A SHA-256 whose running state can be written down and taken up again.

A response's request hash is the SHA-256 of its whole request context, which grows
along the session; the context builder extends one running hash from response to
response (:class:`~agentsession_cas.format.context._Raw`). To judge the next response
of a session opened afresh without hashing its whole path again, the rules' state kept
beside the log (:mod:`agentsession_cas.store.rulestate`) must carry that running hash:
its eight words, the count of bytes hashed and the tail not yet compressed. Python's
``hashlib`` keeps that state to itself, so this module drives OpenSSL's own SHA-256
(the library ``hashlib`` itself uses) through :mod:`ctypes`, whose context structure
is public and laid out the same in every OpenSSL release.

Where that library cannot be loaded safely (only Linux is tried: elsewhere loading the
system's libcrypto this way can abort the process), or answers a self-test wrongly, or
``AGENTSESSION_RESUMABLE_SHA256=0`` is set, :func:`new` gives ``hashlib.sha256`` objects,
which hash the same bytes to the same digest but whose state is not kept: the rules
then rebuild what they need, as before.
"""

from __future__ import annotations

import hashlib
import os
import sys
from typing import Any

__all__ = ["available", "load_state", "new", "state_of"]

_NOT_LOADED = object()
_lib: Any = _NOT_LOADED


#: OpenSSL's libcrypto by the names its releases give it (3, then 1.1), tried before a search.
_SONAMES = ("libcrypto.so.3", "libcrypto.so.1.1")


def _load() -> Any:
    """The ctypes structure and functions, or None when they cannot be had safely."""
    if os.environ.get("AGENTSESSION_RESUMABLE_SHA256", "") == "0" or not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        lib = None
        for soname in _SONAMES:  # (the one hashlib loaded is found by its name: no ldconfig run)
            try:
                lib = ctypes.CDLL(soname)
                break
            except OSError:
                continue
        if lib is None:
            import ctypes.util  # (only here: it imports shutil, tempfile and subprocess)

            name = ctypes.util.find_library("crypto")  # runs `ldconfig -p`: 4-14 ms of a command's start
            if name is None:
                return None
            lib = ctypes.CDLL(name)

        class Ctx(ctypes.Structure):
            # OpenSSL's SHA256_CTX (openssl/sha.h): SHA_LONG h[8], Nl, Nh, data[16]
            # (used as 64 bytes), unsigned int num, md_len.
            _fields_ = [("h", ctypes.c_uint32 * 8), ("Nl", ctypes.c_uint32), ("Nh", ctypes.c_uint32),
                        ("data", ctypes.c_uint8 * 64), ("num", ctypes.c_uint32), ("md_len", ctypes.c_uint32)]

        ptr = ctypes.POINTER(Ctx)
        init, update, final = lib.SHA256_Init, lib.SHA256_Update, lib.SHA256_Final
        init.argtypes, init.restype = [ptr], ctypes.c_int
        update.argtypes, update.restype = [ptr, ctypes.c_char_p, ctypes.c_size_t], ctypes.c_int
        final.argtypes, final.restype = [ctypes.c_char_p, ptr], ctypes.c_int
        funcs = (Ctx, init, update, final, ctypes.create_string_buffer)
        # A self-test: a state written down mid-block and taken up again hashes as hashlib does.
        probe = bytes(range(256)) * 3
        h = _Sha256(funcs)
        h.update(probe[:100])
        h2 = _from_state(funcs, _state(h))
        h2.update(probe[100:])
        if h2.hexdigest() != hashlib.sha256(probe).hexdigest() or h.copy().hexdigest() != hashlib.sha256(probe[:100]).hexdigest():
            return None
        return funcs
    except (OSError, AttributeError, ValueError, TypeError):
        return None


def _funcs() -> Any:
    global _lib
    if _lib is _NOT_LOADED:
        _lib = _load()
    return _lib


class _Sha256:
    """The part of a ``hashlib`` object the context builder uses, over OpenSSL's context."""

    __slots__ = ("_f", "_c")

    def __init__(self, funcs: Any, ctx: Any = None):
        self._f = funcs
        if ctx is None:
            ctx = funcs[0]()
            funcs[1](ctx)
        self._c = ctx

    def update(self, data: bytes) -> None:
        self._f[2](self._c, data, len(data))

    def copy(self) -> _Sha256:
        return _Sha256(self._f, self._f[0].from_buffer_copy(self._c))

    def hexdigest(self) -> str:
        out = self._f[4](32)
        self._f[3](out, self._f[0].from_buffer_copy(self._c))
        return out.raw.hex()


def available() -> bool:
    """Whether :func:`new` gives hashes whose state can be kept."""
    return _funcs() is not None


def new() -> Any:
    """A fresh SHA-256: one whose state :func:`state_of` can write down when this
    machine allows, else a ``hashlib`` one."""
    funcs = _funcs()
    return hashlib.sha256() if funcs is None else _Sha256(funcs)


def _state(h: _Sha256) -> dict[str, Any]:
    c = h._c
    total = (c.Nh << 32 | c.Nl) >> 3
    return {"h": "".join(f"{w:08x}" for w in c.h), "n": total, "tail": bytes(c.data[: c.num]).hex()}


def state_of(h: Any) -> dict[str, Any] | None:
    """The running state of ``h`` (made by :func:`new`) as a JSON object, or None when
    it is a ``hashlib`` hash, whose state cannot be read."""
    return _state(h) if isinstance(h, _Sha256) else None


_HEX = frozenset("0123456789abcdef")


def _hex(v: Any) -> bool:
    return isinstance(v, str) and _HEX.issuperset(v) and len(v) % 2 == 0


def _from_state(funcs: Any, state: Any) -> _Sha256:
    if not isinstance(state, dict) or set(state) != {"h", "n", "tail"}:
        raise ValueError("a hash state is an object of h, n and tail")
    words, total, tail = state["h"], state["n"], state["tail"]
    if not (_hex(words) and len(words) == 64 and isinstance(total, int) and not isinstance(total, bool)
            and 0 <= total < 1 << 61 and _hex(tail)):
        raise ValueError("a hash state's h, n or tail is not of the form")
    raw_tail = bytes.fromhex(tail)
    if len(raw_tail) != total % 64:
        raise ValueError("a hash state's tail is not the bytes its count leaves")
    ctx = funcs[0]()
    for i in range(8):
        ctx.h[i] = int(words[i * 8: i * 8 + 8], 16)
    bits = total << 3
    ctx.Nl, ctx.Nh = bits & 0xFFFFFFFF, bits >> 32
    for i, b in enumerate(raw_tail):
        ctx.data[i] = b
    ctx.num, ctx.md_len = len(raw_tail), 32
    return _Sha256(funcs, ctx)


def load_state(state: Any) -> Any:
    """A hash taken up where :func:`state_of` wrote ``state`` down. ValueError when it
    is not of the form, or this machine cannot take a state up (:func:`available`)."""
    funcs = _funcs()
    if funcs is None:
        raise ValueError("this machine's SHA-256 cannot take a state up")
    return _from_state(funcs, state)
