"""A recorder for Python harnesses: record locally with no network in the loop, then push.

The local-first flow of RFC 0003 ("Local-first writers"): a harness records
into a store on its own disk, where an append costs no round trip, and
publishes by pushing to a shared store that others read, which holds the
session as a mirror. :class:`Recorder` is that flow in a few calls::

    from agentsession_cas.recorder import Recorder

    rec = Recorder.open("~/.agent/cas", harness=("my-agent", "1.2"),
                        records=["run", "dispatch"], remote="/srv/sessions", ref="chat/C123")
    rec.config(model="gpt-5", instructions="Be brief.")
    run = rec.run_start()
    rec.user("What is in this directory?")
    request = rec.request()                      # what to send the model
    rec.items([call_item], response="resp_1")    # the model's complete output items
    rec.response("resp_1", model="gpt-5", usage={...})   # request_hash computed, durable
    rec.dispatch("call_1")                       # durable before the tool runs
    rec.function_output("call_1", "a.txt b.txt")  # durable
    rec.run_end("done")
    rec.close()                                  # commit, push, let go

Every helper builds its entry with the id computed and ``ts`` in the one
spelling RFC 0001 admits, appends it at the head, and makes it durable
where RFC 0001's writing discipline asks: a ``response``, a
``function_call_output`` item, a ``compaction`` or ``branch_summary``, a
``run`` end, a ``dispatch``, and every type the header names in
``records``. Everything else is working state until the next of those or
:meth:`Recorder.commit`.

Opening a session that exists resumes it: the store recovers its log (what
a crash took is dropped; what was committed is there), the recorder
rebuilds what it tracks from the path to the head, and a run the crash left
open is closed with an ``error`` end, as RFC 0001 asks of the writer that
continues such a path. The next push sends what the remote has not seen,
found from what this store remembers of it. See ``docs/recorder.md``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import ContextError, MirrorError, StoreError
from ..format.context import Context, ContextBuilder
from ..format.entry import Entry, Header
from ..format.timestamps import now_ts
from ..lean import dataclass
from ..store.refs import Refs
from ..store.session import AppendResult, Session
from ..store.store import Store
from .local import open_transport
from .operations import ExchangeResult
from .operations import push as push_session
from .transport import Transport

__all__ = ["Recorder", "new_session_id"]

#: Entry types RFC 0001's writing discipline asks to be durable when written.
_DURABLE_TYPES = frozenset({"response", "compaction", "branch_summary", "dispatch"})


def new_session_id() -> str:
    """A UUIDv7 (RFC 9562), which RFC 0001 recommends for a session id: time-ordered,
    so a store's sessions list in the order they were started."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))


@dataclass
class Recorder:
    """One session being recorded into a local store, and published to a remote.

    Make one with :meth:`open`. It owns the session's writer lock while open
    (another process opening the same session gets ``SessionLockedError``),
    appends only at the head, and keeps, along the path to the head, what its
    helpers need: the context (for :meth:`request` and a response's
    ``request_hash``), the calls made and answered, and the run in progress.
    """

    def __init__(
        self,
        store: Store,
        session: Session,
        *,
        remote: Transport | str | os.PathLike | None = None,
        ref: str | None = None,
        owns_store: bool = False,
        resumed: bool = False,
    ):
        self.store = store
        self.session = session
        self.ref = ref
        self.resumed = resumed
        #: What resuming did, in words (recovery, a run closed), for the harness to log.
        self.notes: list[str] = [p.message for p in session.recovered]
        #: The last push's result, if any.
        self.last_push: ExchangeResult | None = None
        self._owns_store = owns_store
        self._remote = remote
        self._transport: Transport | None = None
        self._closed = False
        self._rebuild()

    # -- opening ------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        store: Store | str | os.PathLike,
        session_id: str | None = None,
        *,
        harness: str | Sequence[str] | Mapping[str, str] | None = None,
        cwd: str | None = None,
        records: Iterable[str] | None = None,
        remote: Transport | str | os.PathLike | None = None,
        ref: str | None = None,
        base: str | None = None,
        parent_session: str | None = None,
        media: str | None = None,
        close_open_run: bool = True,
        **header_members: Any,
    ) -> Recorder:
        """Start a session, or resume ``session_id`` if the store holds it.

        ``store`` is an open :class:`Store` or a path (created if need be).
        A new session's header carries ``harness`` (a name, ``(name,
        version)`` or a mapping), ``cwd`` (default: the current directory),
        ``records`` (the record types this harness promises to write),
        ``base``/``parent_session`` for a fork, ``media``, and any other
        member given. ``remote`` is where :meth:`push` publishes (a store's
        path, a ``file://`` URL or a transport); ``ref`` a ref name set here to
        this session and pushed with it. On resume, a run left open is closed
        with an ``error`` end unless ``close_open_run`` is False.
        """
        owns = not isinstance(store, Store)
        st = store if isinstance(store, Store) else Store.init(store, sync="never")
        try:
            resumed = session_id is not None and session_id in st
            if session_id is not None and resumed:
                session = st.session(session_id)
                if session.mark != "record":
                    raise MirrorError(
                        f"session {session_id} is a mirror in {st.describe()}; a recorder writes only a "
                        "session its store is the record of (take it back first)"
                    )
            else:
                header = Header.new(
                    session_id or new_session_id(),
                    harness=_harness(harness),
                    records=list(records) if records is not None else None,
                    base=base,
                    media=media,
                    cwd=cwd if cwd is not None else os.getcwd(),
                    **({"parent_session": parent_session} if parent_session is not None else {}),
                    **header_members,
                )
                session = st.create(header)
            rec = cls(st, session, remote=remote, ref=ref, owns_store=owns, resumed=resumed)
            if ref is not None:
                rec._claim_ref(ref)
            if resumed and close_open_run:
                rec._close_cut_run()
            return rec
        except BaseException:
            if owns:
                st.close()
            raise

    def _claim_ref(self, name: str) -> None:
        """Point the ref at this session here: it is the conversation's current session."""
        refs = Refs(self.store)
        held = refs.get(name)
        if held is None or held.session != self.session.id or refs.state(held) != "ok":
            refs.update(name, self.session.id, expected=held.session if held is not None else None)

    # -- what the recorder tracks along the path --------------------------------------

    def _rebuild(self) -> None:
        """Rebuild the tracked state from the path root..head (on open, and when the
        head moves other than by an append at it)."""
        self._builder = ContextBuilder()
        self._calls: dict[str, str] = {}  # call_id -> function_call entry on the path
        self._answered: set[str] = set()  # call_ids with an output on the path
        head = self.session.head
        self._path: list[Entry] = self.store.path_to(head) if head is not None else []
        for e in self._path:
            self._track(e, on_path=False)

    def _track(self, e: Entry, *, on_path: bool = True) -> None:
        if on_path:
            self._path.append(e)
        self._builder.push(e)
        t = e.type
        call_id = None
        if t == "item":
            item = e.data.get("item")
            kind = item.get("type") if isinstance(item, dict) else None
            call_id = item.get("call_id") if isinstance(item, dict) else None
            if kind == "function_call" and isinstance(call_id, str):
                self._calls[call_id] = e.id
            elif kind == "function_call_output" and isinstance(call_id, str):
                self._answered.add(call_id)
            else:
                call_id = None

    def _close_cut_run(self) -> None:
        """RFC 0001: the writer that continues a path on which a run is open that no
        writer is running closes it first, with ``error`` and a ``ref`` naming the cut."""
        run = self.session.open_run()
        if run is None:
            return
        self.run_end("error", ref="cut off: the writer stopped before the run ended; resumed")
        self.notes.append(f"closed run {run.run_id}, left open by a writer that stopped, with reason error")

    # -- reading ----------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return self.session.id

    @property
    def head(self) -> str | None:
        return self.session.head

    @property
    def run_id(self) -> str | None:
        """The run in progress on the path, if any."""
        run = self.session.open_run()
        return run.run_id if run is not None else None

    def pending_calls(self) -> list[str]:
        """The call ids of function calls on the path with no output yet."""
        return [c for c in self._calls if c not in self._answered]

    def context(self) -> Context:
        """The context at the head (RFC 0001 context building)."""
        return self._builder.context()

    def request(self) -> dict[str, Any]:
        """The canonical request at the head: what to send the model next, and what a
        ``response``'s ``request_hash`` is taken over."""
        return self._builder.context().request()

    # -- appending ----------------------------------------------------------------------

    def _durable(self, e: Entry | Mapping[str, Any]) -> bool:
        data = e.data if isinstance(e, Entry) else e
        t = data.get("type")
        if t in _DURABLE_TYPES or t in self.session.header.records:
            return True
        if t == "run":
            return data.get("phase") == "end"
        item = data.get("item")
        return t == "item" and isinstance(item, dict) and item.get("type") == "function_call_output"

    def append(self, entry: Mapping[str, Any], *, durable: bool | None = None) -> AppendResult:
        """Append any entry at the head (``parent`` and ``ts`` filled in, the id computed),
        durable where the writing discipline asks unless ``durable`` says otherwise."""
        if self._closed:
            raise StoreError(f"the recorder of session {self.session.id} is closed")
        data = dict(entry)
        data.setdefault("parent", self.session.head)
        data.setdefault("ts", now_ts())
        e = Entry.from_dict(data)
        result = self.session.append(e.data, durable=self._durable(e) if durable is None else durable)
        if result.outcome == "continued":
            self._track(e)
        elif result.outcome == "head-moved":
            self._rebuild()
        return result

    def append_batch(self, entries: Iterable[Mapping[str, Any]], *, durable: bool | None = None) -> list[AppendResult]:
        """Append several entries at the head as one batch (``Session.prepare`` then
        ``commit``): each is checked against the session and the ones before it, and
        none is written if any is refused. Durable when any of them asks it (a batch is
        all durable or all lazy). One write of the log, but not all or nothing across a
        crash on the file backend: a prefix of it may be kept, each entry whole and
        committed by the recovery (``docs/store-api.md``)."""
        if self._closed:
            raise StoreError(f"the recorder of session {self.session.id} is closed")
        bodies = [dict(e) for e in entries]
        if durable is None:
            durable = any(self._durable(b) for b in bodies)
        batch = self.session.prepare(bodies, durable=durable)
        planned = [p.entry for p in batch.planned]
        results = batch.commit()
        for e, result in zip(planned, results):
            if result.outcome == "continued":
                self._track(e)
            elif result.outcome == "head-moved":
                self._rebuild()
        return results

    def record(self, type_: str, **body: Any) -> AppendResult:
        """Append an entry of any type with these body members (``info``, ``label``,
        ``env``, ``outcome``, ``link``, ``custom``, ``queued``, an ``ns:type``, ...)."""
        return self.append({"type": type_, **body})

    def config(self, **settings: Any) -> AppendResult:
        """A ``config`` entry: ``model``, ``instructions``, ``tools_added``, ``extra``, ...
        The first on a root SHOULD carry the full settings (RFC 0001)."""
        return self.record("config", **settings)

    def item(self, item: Mapping[str, Any], *, response: str | None = None, **members: Any) -> AppendResult:
        """One conversation ``item`` (a complete one: RFC 0001 forbids partial output).
        ``response`` is the provider's response id for model output."""
        body: dict[str, Any] = {"item": dict(item), **members}
        if response is not None:
            body["response"] = response
        return self.record("item", **body)

    def user(self, text: str, **members: Any) -> AppendResult:
        """A user message of one ``input_text`` part."""
        return self.item({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}, **members)

    def items(self, items: Iterable[Mapping[str, Any]], *, response: str | None = None) -> list[AppendResult]:
        """The model's output items of one call, in order, each carrying ``response``:
        one batch, so a refused item leaves none of them written."""
        return self.append_batch(
            {"type": "item", "item": dict(i), **({"response": response} if response is not None else {})} for i in items
        )

    def response(
        self,
        response_id: str | None = None,
        *,
        model: str | None = None,
        status: str | None = "completed",
        usage: Mapping[str, Any] | None = None,
        error: Any = None,
        incomplete: Any = None,
        latency_ms: int | None = None,
        request_hash: bool | str = True,
        **members: Any,
    ) -> AppendResult:
        """The ``response`` entry closing a model call, after its output items; durable.
        ``request_hash`` True computes it from the path (the request the context
        algorithm rebuilds, the call's own outputs left out), a string records that
        value, False leaves it out."""
        body: dict[str, Any] = dict(members)
        for name, value in (("response_id", response_id), ("model", model), ("status", status),
                            ("usage", usage), ("error", error), ("incomplete", incomplete),
                            ("latency_ms", latency_ms)):
            if value is not None:
                body[name] = dict(value) if isinstance(value, Mapping) else value
        if request_hash is True:
            try:
                body["request_hash"] = self._builder.request_hash_for(response_id)
            except ContextError:
                pass  # a path whose context cannot be built has no request to hash
        elif isinstance(request_hash, str):
            body["request_hash"] = request_hash
        return self.record("response", **body)

    def function_output(self, call_id: str, output: Any, **members: Any) -> AppendResult:
        """A ``function_call_output`` item for ``call_id``; durable (the record that a side
        effect happened)."""
        return self.item({"type": "function_call_output", "call_id": call_id, "output": output}, **members)

    def _target(self, call_id: str) -> str:
        target = self._calls.get(call_id)
        if target is None:
            raise StoreError(f"no function_call with call_id {call_id!r} on the path to the head")
        return target

    def dispatch(self, call_id: str, *, idempotency_key: str | None = None, **members: Any) -> AppendResult:
        """A ``dispatch``: the call is handed to its tool. Durable before it returns, so
        it is on disk before the side effect it precedes."""
        body: dict[str, Any] = {"call_id": call_id, "target": self._target(call_id), **members}
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        return self.record("dispatch", **body)

    def decision(
        self, call_id: str, verdict: str, *, by: str | None = None, reason: str | None = None,
        args: Any = None, **members: Any,
    ) -> AppendResult:
        """A ``decision`` on a call: ``proceed``, ``reject``, ``hold`` or ``answer``."""
        body: dict[str, Any] = {"call_id": call_id, "target": self._target(call_id), "verdict": verdict, **members}
        for name, value in (("by", by), ("reason", reason), ("args", args)):
            if value is not None:
                body[name] = value
        return self.record("decision", **body)

    def run_start(self, *, source: str = "input", ref: str | None = None, trigger: Any = None,
                  run_id: str | None = None) -> str:
        """Start a run (``source`` ``input`` or ``resume``); returns its ``run_id``."""
        rid = run_id or uuid.uuid4().hex
        body: dict[str, Any] = {"run_id": rid, "phase": "start", "source": source}
        if ref is not None:
            body["ref"] = ref
        if trigger is not None:
            body["trigger"] = trigger
        self.record("run", **body)
        return rid

    def run_end(
        self, reason: str | None = None, *, pending: Sequence[str] | None = None, ref: str | None = None
    ) -> AppendResult:
        """End the run in progress; durable. ``reason`` defaults to what the run's segment
        reads (RFC 0001's cascade, computed by the one rule set); a written ``error`` or
        ``interrupted`` stands over any segment, and any other reason the segment does
        not read is refused as ``verify`` would report it (``run-reason``). ``pending``
        defaults to the run's calls with no output on the path."""
        run = self.session.open_run()
        if run is None:
            raise StoreError(f"no run is in progress on the path of session {self.session.id}")
        body: dict[str, Any] = {
            "run_id": run.run_id,
            "phase": "end",
            "reason": run.reason if reason is None else reason,
            "pending": list(run.pending if pending is None else pending),
        }
        if ref is not None:
            body["ref"] = ref
        return self.record("run", **body)

    def rewind(self, entry_id: str) -> None:
        """Move the head back to an earlier entry (the base or an own entry), durably, by
        compare-and-swap: the next append starts a branch there; the entries after it
        stay in the log as the abandoned branch."""
        self.session.set_head(entry_id, expected=self.session.head)
        self._rebuild()

    def commit(self) -> None:
        """Make everything appended so far durable."""
        self.session.commit()

    # -- publishing -------------------------------------------------------------------

    def push(self, **kwargs: Any) -> ExchangeResult:
        """Push what the remote has not seen (committing first), with the ref if one was
        given; ``kwargs`` go to :func:`agentsession_cas.exchange.push` (``expected``,
        ``force``, ``progress``). A head that moved at the remote is reported in the
        result (``outcome == "refused"``), not raised."""
        if self._remote is None:
            raise StoreError("this recorder has no remote to push to (give Recorder.open a remote)")
        if self._transport is None:
            self._transport = self._remote if isinstance(self._remote, Transport) else open_transport(self._remote)
        refs = [self.ref] if self.ref is not None else []
        self.session.commit()
        result = push_session(self.store, self._transport, self.session.id, session=self.session, refs=refs, **kwargs)
        self.last_push = result
        return result

    def close(self, *, push: bool = True) -> ExchangeResult | None:
        """Commit, push (when there is a remote and ``push``, and this store is still the
        session's record), and let the session go. Returns the last push's result. The
        session is released even when the push fails; the error is raised after."""
        if self._closed:
            return self.last_push
        result = self.last_push
        try:
            self.session.commit()
            # A session handed over (``push(handover=True)``) is a mirror here now: the
            # remote is its record and already holds all of it, and a mirror may not push.
            if push and self._remote is not None and self.session.mark == "record":
                result = self.push()
        finally:
            self._closed = True
            try:
                if self._transport is not None and not isinstance(self._remote, Transport):
                    self._transport.close()
            finally:
                if self._owns_store:
                    self.store.close()
                else:
                    self.session.close()
        return result

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # After an exception the harness is failing: commit what it wrote, and push only
        # on a clean exit (a failed run is the harness's to record before it leaves).
        self.close(push=exc_type is None)

    def __repr__(self) -> str:
        return f"Recorder({self.session.id!r}, head={self.session.head}, remote={self._remote!r})"


def _harness(harness: str | Sequence[str] | Mapping[str, str] | None) -> dict[str, str] | None:
    if harness is None:
        return None
    if isinstance(harness, str):
        return {"name": harness}
    if isinstance(harness, Mapping):
        return {str(k): str(v) for k, v in harness.items()}
    parts = list(harness)
    if not parts or len(parts) > 2:
        raise StoreError("harness is a name, (name, version), or a mapping")
    out = {"name": str(parts[0])}
    if len(parts) == 2:
        out["version"] = str(parts[1])
    return out
