"""What a model call was sent: settings replay, the context algorithm, the canonical
request and the verification of ``request_hash`` (RFC 0001 "Context building",
"Request context of a response", "Request hash").

The pieces, in the order a reader meets them:

* :class:`Settings` is the request settings in force at a point on a path. It is
  immutable: :meth:`Settings.apply` returns the settings after a ``config`` delta
  (``replace``, ``model``, ``instructions``, ``instructions_parts`` resolved
  against the parts in force and those that left force, ``instructions_omitted``
  with its ``keep`` and ``of`` elements, ``omit``, ``reasoning``, ``text``,
  ``tools_added``/``tools_removed``, ``extra`` with null deletions), and
  :meth:`Settings.from_checkpoint` reads a compaction's full ``config``.
* :class:`ContextBuilder` walks a path one entry at a time (``push``) and can
  step back (``pop``), so one builder serves every entry of a tree in a
  depth-first walk. :meth:`ContextBuilder.context` gives the :class:`Context`
  at the tip: settings, items, the entries selected, the entry each item came
  from, and the items the ``omit`` setting left out or sent with a placeholder.
* :func:`canonical_request` and :func:`request_hash` are step 5: the payload
  profile's request with ``store: false``, no ``previous_response_id`` and the
  settings' ``extra`` members at the top level, hashed as RFC 8785 bytes.
* :func:`verify_requests` checks every ``response`` of a session file: each is
  ``ok``, ``mismatch`` (with what differs, as far as can be told), ``no-hash``
  (never counted as verified) or ``error``. The hash of each request is kept
  incremental (see :class:`_Raw`), so a long session verifies in time linear in
  its size, not in the sum of its requests' sizes.
* :class:`ContextHasher` is RFC 0002's context hash, fed one entry at a time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import AgentSessionError, ContextError
from ..lean import dataclass
from . import resumable
from .canonical import canonical_bytes, canonical_members, member_order
from .entry import ENTRY_ID, Entry, short_id
from .hashing import HASH_PREFIX, is_hash, sha256_ref

__all__ = [
    "PART_SEPARATOR",
    "OMIT_OTHER_MODELS",
    "CONTEXT_TYPES",
    "NULL_CONTEXT_HASH",
    "Part",
    "OmittedElement",
    "Omit",
    "Settings",
    "Context",
    "OmittedItem",
    "ReplacedItem",
    "ContextBuilder",
    "RequestCheck",
    "RequestReport",
    "build_context",
    "context_at",
    "output_entries",
    "request_context",
    "canonical_request",
    "request_bytes",
    "request_hash",
    "request_hash_for",
    "verify_response",
    "check_tip",
    "DIAGNOSE_LIMIT",
    "text_hash",
    "tool_name",
    "ContextHasher",
    "context_hash_step",
    "context_hashes",
]

if TYPE_CHECKING:  # (in results.py, loaded on first use: below)
    from .results import Context, OmittedItem, ReplacedItem, RequestReport
else:
    def __getattr__(name: str) -> Any:
        """What moved to ``results.py`` (loaded only by what builds or reports it),
        importable from here as before."""
        if name in ("Context", "OmittedItem", "ReplacedItem", "RequestReport"):
            from . import results

            return getattr(results, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: Instruction parts are joined with one blank line (RFC 0001 "Instructions as parts").
PART_SEPARATOR = "\n\n"
#: The one value of ``omit.reasoning`` the format defines.
OMIT_OTHER_MODELS = "other_models"
#: Reasons an item is left out of, or changed in, a request.
REASON_ITEMS = "items"
REASON_OTHER_MODELS = "other_models"
REASON_OUTPUTS = "outputs"
REASON_IMAGES = "images"

#: Entry types that contribute to the context hash (RFC 0002 "Prefix caching").
CONTEXT_TYPES = frozenset({"item", "config", "compaction", "branch_summary"})
#: The context hash before any contributing entry: the hash of canonical ``null``.
NULL_CONTEXT_HASH = sha256_ref(b"null")


def text_hash(text: str) -> str:
    """``sha256:`` + hex of a text's UTF-8 bytes: how a delta names an unchanged part."""
    return sha256_ref(text.encode("utf-8", "surrogatepass"))


def tool_name(tool: Any) -> str:
    """A tool's name: a function tool's ``name``, an extension tool's ``name`` member, else ""."""
    if isinstance(tool, dict):
        name = tool.get("name")
        if isinstance(name, str):
            return name
    return ""


def _positive_int(value: Any) -> bool:
    """A ``keep`` counts only as a positive integer (not a bool, not 2.0)."""
    return type(value) is int and value > 0


def _name(value: Any) -> str | None:
    """A non-empty string id, or None (an empty or missing id names nothing)."""
    return value if isinstance(value, str) and value else None


# ---------------------------------------------------------------------------
# instruction parts


@dataclass(frozen=True)
class Part:
    """One instruction part in force. ``unresolved`` parts have no text the path can
    rebuild (a hash or keep it could not resolve, or an element naming nothing);
    ``written`` is the element as the delta wrote it, shown for those."""

    id: str | None
    text: str | None
    source: str | None = None
    unresolved: bool = False
    written: Any = None

    def as_dict(self) -> Any:
        if self.unresolved:
            return self.written
        out: dict[str, Any] = {"id": self.id}
        if self.text:
            out["text"] = self.text
        if self.source:
            out["source"] = self.source
        return out


def _join(parts: Sequence[Part]) -> str:
    return PART_SEPARATOR.join(p.text or "" for p in parts)


def _resolve_parts(
    elements: list, old: Sequence[Part], history: Mapping[tuple[str, str], tuple[str, str | None]]
) -> tuple[tuple[Part, ...], dict[tuple[str, str], tuple[str, str | None]]]:
    """Resolve a delta's ``instructions_parts`` against the parts in force (``old``) and
    the texts the path gave each id before they left force (``history``)."""
    named = {n for el in elements if isinstance(el, dict) and (n := _name(el.get("id"))) is not None}
    first: dict[str, int] = {}
    for i, p in enumerate(old):
        if p.id is not None:
            first.setdefault(p.id, i)
    cursor = 0
    out: list[Part] = []
    for el in elements:
        pid = _name(el.get("id")) if isinstance(el, dict) else None
        if pid is not None:
            if pid in first:
                cursor = first[pid] + 1
            source = el.get("source")
            explicit = source if isinstance(source, str) else None
            if "text" in el:
                text = el["text"]
                if isinstance(text, str):
                    out.append(Part(pid, text, explicit, False, el))
                else:
                    out.append(Part(pid, None, None, True, el))
            elif "hash" in el:
                h = el["hash"]
                current = old[first[pid]] if pid in first else None
                if current is not None and not current.unresolved and isinstance(h, str) and text_hash(current.text or "") == h:
                    out.append(Part(pid, current.text, explicit if explicit is not None else current.source, False, el))
                elif isinstance(h, str) and (pid, h) in history:
                    text, kept_source = history[(pid, h)]
                    out.append(Part(pid, text, explicit if explicit is not None else kept_source, False, el))
                else:
                    out.append(Part(pid, None, None, True, el))
            else:  # an id with neither text nor hash: empty text
                out.append(Part(pid, "", explicit, False, el))
        elif isinstance(el, dict) and _positive_int(el.get("keep")):
            n = el["keep"]
            taken = old[cursor : cursor + n]
            cursor += n
            if len(taken) < n or any(p.id in named for p in taken if p.id is not None):
                out.append(Part(None, None, None, True, el))
            else:
                out.extend(taken)
        else:
            out.append(Part(None, None, None, True, el))
    new_history = dict(history)
    for p in out:
        if not p.unresolved and p.id is not None:
            new_history[(p.id, text_hash(p.text or ""))] = (p.text or "", p.source)
    return tuple(out), new_history


# ---------------------------------------------------------------------------
# omitted instruction parts


@dataclass(frozen=True)
class OmittedElement:
    """One element of the ``instructions_omitted`` list in force: a part the writer left
    out (as written), or an element that names no part (``unresolved``, kept as written)."""

    data: Any
    unresolved: bool = False

    @property
    def id(self) -> str | None:
        return None if self.unresolved or not isinstance(self.data, dict) else _name(self.data.get("id"))


def _resolve_omitted(
    elements: list, old: Sequence[OmittedElement], lists: Mapping[str, tuple[OmittedElement, ...]]
) -> tuple[tuple[OmittedElement, ...], str | None]:
    """Resolve a delta's ``instructions_omitted`` (``keep``, ``keep`` + ``of``) against the
    list in force and the lists earlier config entries put in force. Returns the new list
    and the ``of`` of the first ``keep`` that could not be resolved (a note, not
    corruption), or None."""
    named = {n for el in elements if isinstance(el, dict) and (n := _name(el.get("id"))) is not None}
    sources: dict[str | None, Sequence[OmittedElement] | None] = {None: old}
    for el in elements:
        if isinstance(el, dict) and _name(el.get("id")) is None and _positive_int(el.get("keep")):
            of = _name(el.get("of"))
            if of is not None:
                sources[of] = lists.get(of)
    positions: dict[str | None, dict[str, int]] = {}
    for key, lst in sources.items():
        pos: dict[str, int] = {}
        for i, o in enumerate(lst or ()):
            if o.id is not None:
                pos.setdefault(o.id, i)
        positions[key] = pos
    cursors: dict[str | None, int] = {key: 0 for key in sources}
    out: list[OmittedElement] = []
    bad_of: str | None = None
    for el in elements:
        pid = _name(el.get("id")) if isinstance(el, dict) else None
        if pid is not None:
            out.append(OmittedElement(el))
            for key, pos in positions.items():
                if pid in pos:
                    cursors[key] = pos[pid] + 1
        elif isinstance(el, dict) and _positive_int(el.get("keep")):
            n = el["keep"]
            key = _name(el.get("of"))
            lst = sources.get(key)
            start = cursors[key]
            cursors[key] = start + n
            taken = list(lst[start : start + n]) if lst is not None else []
            if lst is None or len(taken) < n or any(t.id in named for t in taken if t.id is not None):
                out.append(OmittedElement(el, True))
                if bad_of is None and key is not None:
                    bad_of = key
            else:
                out.extend(taken)
        else:
            out.append(OmittedElement(el, True))
    return tuple(out), bad_of


# ---------------------------------------------------------------------------
# the omit setting


def _images_form(value: Any) -> dict[str, Any] | None:
    """``omit.images`` in one of its two forms, spelled exactly, or None."""
    if not isinstance(value, dict) or not isinstance(value.get("placeholder"), str):
        return None
    if set(value) - {"placeholder", "keep", "before"}:
        return None
    before, keep = value.get("before"), value.get("keep")
    if "before" in value and "keep" not in value and _name(before) is not None:
        return {"before": before, "placeholder": value["placeholder"]}
    if "keep" in value and "before" not in value and type(keep) is int and keep >= 0:
        return {"keep": keep, "placeholder": value["placeholder"]}
    return None


def _outputs_form(value: Any) -> tuple[str, tuple[str, ...]] | None:
    if not isinstance(value, dict) or not isinstance(value.get("text"), str):
        return None
    items = value.get("items", [])
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        return None
    return value["text"], tuple(i for i in items if i)


@dataclass(frozen=True)
class Omit:
    """The ``omit`` setting in force: what a request leaves out though it is on the path,
    and (format 0.14) what it sends a placeholder for."""

    reasoning: str | None = None
    items: tuple[str, ...] = ()
    outputs_text: str | None = None
    outputs_items: tuple[str, ...] = ()
    images: dict[str, Any] | None = None

    @property
    def zero(self) -> bool:
        return self.reasoning is None and not self.items and self.outputs_text is None and self.images is None

    @staticmethod
    def _names_nothing(delta: Mapping[str, Any]) -> bool:
        items = delta.get("items")
        outputs = delta.get("outputs")
        return (
            not _name(delta.get("reasoning"))
            and not (isinstance(items, list) and any(_name(i) for i in items))
            and outputs is None
            and delta.get("images") is None
        )

    def apply(self, delta: Any) -> Omit:
        """The omit after a config delta's ``omit`` member: null leaves it, an object naming
        nothing clears it, anything else sets the rule it names and adds its entries."""
        if not isinstance(delta, dict):
            return self
        if self._names_nothing(delta):
            return Omit()
        reasoning = self.reasoning
        if delta.get("reasoning") == OMIT_OTHER_MODELS:
            reasoning = OMIT_OTHER_MODELS
        items = list(self.items)
        if isinstance(delta.get("items"), list):
            for i in delta["items"]:
                if _name(i) is not None and i not in items:
                    items.append(i)
        outputs_text, outputs_items = self.outputs_text, list(self.outputs_items)
        outputs = _outputs_form(delta.get("outputs"))
        if outputs is not None:
            outputs_text = outputs[0]
            outputs_items.extend(i for i in outputs[1] if i not in outputs_items)
        images = _images_form(delta.get("images")) or self.images
        return Omit(reasoning, tuple(items), outputs_text, tuple(outputs_items), images)

    @classmethod
    def from_object(cls, value: Any) -> Omit:
        """The omit a compaction checkpoint carries (the object in force, not a delta)."""
        return cls().apply(value) if isinstance(value, dict) else cls()

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.reasoning is not None:
            out["reasoning"] = self.reasoning
        if self.items:
            out["items"] = list(self.items)
        if self.outputs_text is not None:
            out["outputs"] = {"text": self.outputs_text, **({"items": list(self.outputs_items)} if self.outputs_items else {})}
        if self.images is not None:
            out["images"] = dict(self.images)
        return out


# ---------------------------------------------------------------------------
# settings


_INPUT_KEY = member_order("input")


class Settings:
    """The request settings in force at a point on a path: the result of replaying
    ``config`` entries. Immutable; :meth:`apply` returns new settings.

    ``instructions`` is the string the request carries (the parts joined, when the
    path composed them); ``parts`` is None for a path that set the instructions as
    one string. ``omitted`` is the ``instructions_omitted`` list in force, which
    reaches no request.
    """

    __slots__ = (
        "model", "instructions", "parts", "omitted", "omit", "reasoning", "text", "tools", "extra",
        "_history", "_lists", "_split", "_encoded",
    )

    def __init__(self) -> None:
        self.model: str | None = None
        self.instructions: str | None = None
        self.parts: tuple[Part, ...] | None = None
        self.omitted: tuple[OmittedElement, ...] = ()
        self.omit: Omit = Omit()
        self.reasoning: Any = None
        self.text: Any = None
        self.tools: tuple[Any, ...] = ()
        self.extra: dict[str, Any] = {}
        # (id, text hash) -> (text, source) for every part the path gave since the last
        # replace or checkpoint, so a hash can name a part that has left force.
        self._history: dict[tuple[str, str], tuple[str, str | None]] = {}
        # config entry id -> the omitted list it put in force (for ``of``).
        self._lists: dict[str, tuple[OmittedElement, ...]] = {}
        self._split: tuple[bytes, bytes] | None = None
        # request member -> (the value it was encoded from, its canonical bytes), shared by
        # the settings a path derives from these: a config changing one member (a
        # temperature) leaves the others' objects as they were, tools and instructions
        # often most of a request, and their bytes are not made again (see request_split).
        self._encoded: dict[str, tuple[Any, bytes]] = {}

    def _copy(self) -> Settings:
        s = Settings.__new__(Settings)
        for name in Settings.__slots__:
            setattr(s, name, getattr(self, name))
        s._split = None
        if self is EMPTY_SETTINGS:
            s._encoded = {}  # (a path's own, not every path's since the process began)
        return s

    # -- replay -------------------------------------------------------------

    def apply(self, delta: Mapping[str, Any], entry_id: str | None = None) -> Settings:
        """The settings after the ``config`` delta ``delta`` (an entry's members)."""
        s, _ = self.apply_checked(delta, entry_id)
        return s

    def apply_checked(self, delta: Mapping[str, Any], entry_id: str | None = None) -> tuple[Settings, str | None]:
        """:meth:`apply`, and the ``of`` of an omitted-parts ``keep`` in the delta that the
        path cannot resolve (which a verifier notes), or None."""
        base = EMPTY_SETTINGS if delta.get("replace") is True else self
        s = base._copy()
        model = delta.get("model")
        if isinstance(model, str) and model:
            s.model = model
        instructions = delta.get("instructions")
        parts = delta.get("instructions_parts")
        if isinstance(parts, list):
            resolved, s._history = _resolve_parts(parts, base.parts or (), base._history)
            s.parts = resolved
            if any(p.unresolved for p in resolved) and isinstance(instructions, str):
                s.instructions = instructions  # the only record of what was sent
            else:
                s.instructions = _join(resolved)
        elif isinstance(instructions, str):
            s.instructions = instructions
            s.parts = None
        bad_of: str | None = None
        omitted = delta.get("instructions_omitted")
        if isinstance(omitted, list):
            s.omitted, bad_of = _resolve_omitted(omitted, base.omitted, base._lists)
            if entry_id is not None:
                s._lists = {**base._lists, entry_id: s.omitted}
        if delta.get("reasoning") is not None:
            s.reasoning = delta["reasoning"]
        if delta.get("text") is not None:
            s.text = delta["text"]
        removed, added = delta.get("tools_removed"), delta.get("tools_added")
        if isinstance(removed, list) or isinstance(added, list):
            tools = list(base.tools)
            if isinstance(removed, list):
                gone = {r for r in removed if isinstance(r, str)}
                tools = [t for t in tools if tool_name(t) not in gone]
            if isinstance(added, list):
                for tool in added:
                    name = tool_name(tool)
                    at = next((i for i, t in enumerate(tools) if name and tool_name(t) == name), None)
                    if at is None:
                        tools.append(tool)
                    else:
                        tools[at] = tool
            s.tools = tuple(tools)
        extra = delta.get("extra")
        if isinstance(extra, dict):
            merged = dict(base.extra)
            for key, value in extra.items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
            s.extra = merged
        s.omit = base.omit.apply(delta.get("omit"))
        return s, bad_of

    @classmethod
    def from_checkpoint(cls, config: Any) -> Settings:
        """Settings from a compaction's ``config``: the full settings, taken as they stand
        (parts each with its text, the omitted list with no ``keep`` resolved)."""
        s = cls()
        if not isinstance(config, dict):
            return s
        if isinstance(config.get("model"), str) and config["model"]:
            s.model = config["model"]
        parts = config.get("instructions_parts")
        if isinstance(parts, list):
            out = []
            for el in parts:
                pid = _name(el.get("id")) if isinstance(el, dict) else None
                text = el.get("text", "") if isinstance(el, dict) else None
                if pid is not None and isinstance(text, str):
                    source = el.get("source")
                    out.append(Part(pid, text, source if isinstance(source, str) else None, False, el))
                else:
                    out.append(Part(None, None, None, True, el))
            s.parts = tuple(out)
            s._history = {(p.id, text_hash(p.text or "")): (p.text or "", p.source) for p in out if not p.unresolved and p.id}
        if isinstance(config.get("instructions"), str):
            s.instructions = config["instructions"]
        elif s.parts is not None:
            s.instructions = _join(s.parts)
        omitted = config.get("instructions_omitted")
        if isinstance(omitted, list):
            s.omitted = tuple(OmittedElement(el, _name(el.get("id")) is None if isinstance(el, dict) else True) for el in omitted)
        s.omit = Omit.from_object(config.get("omit"))
        if config.get("reasoning") is not None:
            s.reasoning = config["reasoning"]
        if config.get("text") is not None:
            s.text = config["text"]
        if isinstance(config.get("tools"), list):
            s.tools = tuple(config["tools"])
        if isinstance(config.get("extra"), dict):
            s.extra = dict(config["extra"])
        return s

    def without_omit(self) -> Settings:
        """These settings with no omit in force (for a diagnosis)."""
        if self.omit.zero:
            return self
        s = self._copy()
        s.omit = Omit()
        return s

    # -- output ---------------------------------------------------------------

    def as_dict(self) -> dict[str, Any]:
        """The settings in the checkpoint shape RFC 0001 gives a compaction's ``config``
        (members with empty values left out), as the corpus context files hold them."""
        out: dict[str, Any] = {}
        if self.model:
            out["model"] = self.model
        if self.instructions:
            out["instructions"] = self.instructions
        if self.parts:
            out["instructions_parts"] = [p.as_dict() for p in self.parts]
        if self.omitted:
            out["instructions_omitted"] = [o.data for o in self.omitted]
        if not self.omit.zero:
            out["omit"] = self.omit.as_dict()
        if self.reasoning not in (None, {}):
            out["reasoning"] = self.reasoning
        if self.text not in (None, {}):
            out["text"] = self.text
        if self.tools:
            out["tools"] = list(self.tools)
        if self.extra:
            out["extra"] = dict(self.extra)
        return out

    def request_members(self) -> dict[str, Any]:
        """Every member of the canonical request but ``input``: the ``extra`` members,
        then the named settings over them, ``store: false``, no ``previous_response_id``."""
        req = dict(self.extra)
        req.pop("previous_response_id", None)
        req.pop("input", None)
        if self.model:
            req["model"] = self.model
        if self.instructions:
            req["instructions"] = self.instructions
        if self.tools:
            req["tools"] = list(self.tools)
        if self.reasoning not in (None, {}):
            req["reasoning"] = self.reasoning
        if self.text not in (None, {}):
            req["text"] = self.text
        req["store"] = False
        return req

    def request_split(self) -> tuple[bytes, bytes]:
        """The canonical bytes of the request's members that sort before ``input`` and of
        those after it (RFC 8785 sorts by UTF-16 code units), without braces. Cached."""
        if self._split is None:
            encoded = self._encoded
            halves: tuple[dict[str, bytes], dict[str, bytes]] = ({}, {})
            for name, value in self.request_members().items():
                # (``tools`` is a list made anew from the tuple each time: the tuple is the
                # value's identity; an ``extra`` member named so stands for itself)
                source = self.tools if name == "tools" and self.tools else value
                held = encoded.get(name)
                if held is None or held[0] is not source:
                    held = encoded[name] = (source, canonical_bytes(value))
                halves[member_order(name) > _INPUT_KEY][name] = held[1]
            self._split = (canonical_members(halves[0]), canonical_members(halves[1]))
        return self._split

    def __repr__(self) -> str:
        return f"Settings({self.as_dict()!r})"


EMPTY_SETTINGS = Settings()


def replay_settings(entries: Iterable[Entry]) -> Settings:
    """The settings a builder holds after the ``config`` and ``compaction`` entries of a
    path, in path order (the others change none): what :meth:`ContextBuilder.push` folds
    entry by entry, for a caller that kept only those entries (store/rulestate.py)."""
    s = EMPTY_SETTINGS
    for e in entries:
        if e.type == "compaction":
            s = Settings.from_checkpoint(e.data.get("config"))
        else:
            s, _ = s.apply_checked(e.data, e.id)
    return s


# ---------------------------------------------------------------------------
# the canonical request


def canonical_request(settings: Settings, items: Sequence[Any]) -> dict[str, Any]:
    """The request of RFC 0001 step 5: settings plus the item list as ``input``."""
    req = settings.request_members()
    req["input"] = list(items)
    return req


def request_bytes(settings: Settings, items: Sequence[Any]) -> bytes:
    """The canonical (RFC 8785) bytes of :func:`canonical_request`."""
    return canonical_bytes(canonical_request(settings, items))


def request_hash(request: Mapping[str, Any] | bytes) -> str:
    """``sha256:`` + hex of a request's canonical bytes (a dict, or bytes already canonical)."""
    data = request if isinstance(request, (bytes, bytearray)) else canonical_bytes(request)
    return sha256_ref(bytes(data))


# ---------------------------------------------------------------------------
# contexts


class _Items(Sequence[Any]):
    """A context's items read from their entries only as each is asked for: what a
    caller that parks the path's entries (:meth:`Entry.park`) takes, so the items are
    read back one at a time as they are used, never all held at once (``show`` of a
    long stored session)."""

    __slots__ = ("_of",)

    def __init__(self, contributions: list[_Contribution]):
        self._of = contributions

    def __len__(self) -> int:
        return len(self._of)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [c.item for c in self._of[i]]
        return self._of[i].item

    def __iter__(self) -> Iterator[Any]:
        for c in self._of:
            yield c.item


#: A contribution as the builder holds it: (position on the path, kind, model, index).
_Placed = tuple[int, str, "str | None", int]


class _Contribution:
    """One item the context algorithm placed in the list: from an ``item`` entry (the
    only kind ``omit`` reaches), a compaction's summary or pin, or a branch summary.

    It names where its item is (the entry, and the kind: ``item``'s member, the
    ``summary``, the ``index``-th of ``pinned``) rather than holding it, so an entry a
    one-pass check parked (:meth:`Entry.park`) is not kept whole by its contribution."""

    __slots__ = ("entry", "kind", "model", "pos", "index")

    def __init__(self, entry: Entry, kind: str, model: str | None, pos: int, index: int = 0):
        self.entry = entry
        self.kind = kind
        self.model = model  # the model in force when the entry was written
        self.pos = pos  # its position on the path
        self.index = index  # a pin's place in its compaction's ``pinned``

    @property
    def item(self) -> dict[str, Any]:
        return _placed_item(self.entry, self.kind, self.index)


def _placed_item(entry: Entry, kind: str, index: int) -> dict[str, Any]:
    """The item a contribution of ``kind`` (and ``index``) reads from ``entry``."""
    data = entry.data
    if kind == "item":
        return data["item"]
    if kind == "pinned":
        return data["pinned"][index]
    return data["summary"]


def _replace_images(item: dict, indexes: set[tuple[str, int]], placeholder: str) -> dict:
    out = dict(item)
    for key in ("content", "output"):
        parts = item.get(key)
        if isinstance(parts, list) and any(k == key for k, _ in indexes):
            out[key] = [
                {"type": "input_text", "text": placeholder} if (key, i) in indexes else p for i, p in enumerate(parts)
            ]
    return out


def _image_keys(item: Any) -> list[tuple[str, int]]:
    keys: list[tuple[str, int]] = []
    if isinstance(item, dict):
        for key in ("content", "output"):
            parts = item.get(key)
            if isinstance(parts, list):
                keys.extend((key, i) for i, p in enumerate(parts) if isinstance(p, dict) and p.get("type") == "input_image")
    return keys


def _is_reasoning_output(c: _Contribution) -> bool:
    return (
        isinstance(c.item, dict)
        and c.item.get("type") == "reasoning"
        and _name(c.entry.data.get("response")) is not None
    )


def _omit_reason(c: _Contribution, settings: Settings, omit_items: frozenset[str]) -> str | None:
    """Why the omit in force leaves this contribution out, or None. An entry both rules
    reach is reported as listed."""
    if c.kind != "item":
        return None
    if c.entry.id in omit_items:
        return REASON_ITEMS
    if settings.omit.reasoning == OMIT_OTHER_MODELS and _is_reasoning_output(c) and c.model != settings.model:
        return REASON_OTHER_MODELS
    return None


#: An item entry the omit in force leaves out, and why: an ``OmittedItem``'s fields.
_Omitted = tuple[Entry, str]
#: An item entry sent with a placeholder, why, and how many image parts: a ``ReplacedItem``'s.
_Replaced = tuple[Entry, str, int]


def _apply_omit(
    raw: Sequence[_Contribution], settings: Settings, path_index: Mapping[str, int]
) -> tuple[list[tuple[_Contribution, Any]], list[_Omitted], list[_Replaced]]:
    """Apply the omit in force at the end of the path to the contributions: each kept
    contribution with the item as sent (the recorded object itself when unchanged),
    and what was left out or sent with a placeholder (as tuples: a request hash, which
    an append computes, uses none of them; :meth:`ContextBuilder.context` makes them
    ``OmittedItem`` and ``ReplacedItem``)."""
    omit = settings.omit
    if omit.zero:
        return [(c, c.item) for c in raw], [], []
    omit_items = frozenset(omit.items)
    outputs = frozenset(omit.outputs_items)
    kept: list[tuple[_Contribution, Any]] = []
    omitted: list[_Omitted] = []
    replaced: list[_Replaced] = []
    for c in raw:
        reason = _omit_reason(c, settings, omit_items)
        if reason is not None:
            omitted.append((c.entry, reason))
            continue
        item = c.item
        if (
            c.kind == "item"
            and omit.outputs_text is not None
            and c.entry.id in outputs
            and isinstance(item, dict)
            and item.get("type") == "function_call_output"
        ):
            item = {**item, "output": omit.outputs_text}
            replaced.append((c.entry, REASON_OUTPUTS, 0))
        kept.append((c, item))
    images = omit.images
    if images is not None:
        targets: list[tuple[int, tuple[str, int]]] = []  # (index in kept, part key)
        if "keep" in images:
            for k, (c, item) in enumerate(kept):
                if c.kind == "item":
                    targets.extend((k, key) for key in _image_keys(item))
            targets = targets[: max(0, len(targets) - images["keep"])]
        else:
            limit = path_index.get(images["before"])
            if limit is not None:
                for k, (c, item) in enumerate(kept):
                    if c.kind == "item" and c.pos < limit:
                        targets.extend((k, key) for key in _image_keys(item))
        by_item: dict[int, set[tuple[str, int]]] = {}
        for k, key in targets:
            by_item.setdefault(k, set()).add(key)
        for k in sorted(by_item):
            c, item = kept[k]
            kept[k] = (c, _replace_images(item, by_item[k], images["placeholder"]))
            replaced.append((c.entry, REASON_IMAGES, len(by_item[k])))
        replaced.sort(key=lambda r: path_index.get(r[0].id, -1))
    return kept, omitted, replaced


# ---------------------------------------------------------------------------
# incremental request hashing


#: A request hash in progress: (sig, upto, last, count, h), the SHA-256 state ``h`` after
#: ``{<members before input>,"input":[`` and the items sent from the first ``upto``
#: contributions (``count`` of them), under the signature ``sig``; ``last`` is the
#: contribution at ``upto - 1``. A plain tuple: with no omit in force it holds nothing the
#: collector walks (a hash state is not one), and a path keeps one per response.
_Mark = tuple[tuple, int, _Placed | None, int, Any]


class _Raw:
    """The contributions on the path since the last compaction (a stack), with the
    request hashes in progress over them.

    A request is the settings around a list of items, and between two model calls on
    a path the list only grows, so the hash of each request extends the SHA-256 state
    the one before left (``hashlib`` states can be copied) instead of hashing the
    whole request again. A mark is valid for this list while the contribution it
    ended at is still at its index: contributions are only pushed and popped, never
    changed in place, so that one check proves the whole prefix unchanged. Settings
    that change the members sorting before ``input``, or the omit in force, change
    the signature, and the next request starts a new mark from the first item.

    Each contribution is held as a :data:`_Placed` tuple, its entry found on the
    builder's ``path`` by position (:meth:`take` makes :class:`_Contribution` objects
    of those a caller reads): a tuple of atomic values is one the collector stops
    tracking, and a long path holds one per item.
    """

    __slots__ = ("path", "items", "marks")

    MAX_PROBE = 8

    def __init__(self, path: list[Entry], items: list[_Placed] | None = None):
        self.path = path
        self.items: list[_Placed] = items if items is not None else []
        self.marks: list[_Mark] = []

    def take(self, start: int, end: int) -> list[_Contribution]:
        """The contributions from ``start`` to ``end``, each with its entry."""
        path = self.path
        return [_Contribution(path[pos], kind, model, pos, index) for pos, kind, model, index in self.items[start:end]]

    def truncate(self, n: int) -> None:
        del self.items[n:]
        while self.marks and self.marks[-1][1] > n:
            self.marks.pop()

    def _valid(self, mark: _Mark, sig: tuple, upto: int) -> bool:
        msig, mupto, last, _, _ = mark
        return (
            msig == sig
            and mupto <= upto
            and (mupto == 0 or (mupto <= len(self.items) and self.items[mupto - 1] is last))
        )

    def hash_request(self, upto: int, settings: Settings, path_index: Mapping[str, int]) -> str:
        """The request hash of the first ``upto`` contributions under ``settings``."""
        omit = settings.omit
        if omit.images is not None and "keep" in omit.images:
            # Which images get the placeholder depends on how many follow: not a prefix.
            kept, _, _ = _apply_omit(self.take(0, upto), settings, path_index)
            return sha256_ref(request_bytes(settings, [item for _, item in kept]))
        before, after = settings.request_split()
        if omit.zero:
            sig: tuple = (before,)
        else:
            limit = path_index.get(omit.images["before"]) if omit.images is not None else None
            sig = (before, omit, settings.model, limit)
        start: _Mark | None = None
        for mark in reversed(self.marks[-self.MAX_PROBE :]):
            if self._valid(mark, sig, upto):
                start = mark
                break
        if start is None:
            h = resumable.new()  # (a state that can be kept: store/rulestate.py)
            h.update(b"{" + before + (b"," if before else b"") + b'"input":[')
            upto0, count = 0, 0
        else:
            _, upto0, _, count, h = start
            h = h.copy()
        if upto0 < upto:
            # Each item's bytes are taken from its entry once, hashed into the mark below: a
            # path keeps no second copy of its items.
            if omit.zero:  # the common case: every item as recorded, no contribution objects made
                path = self.path
                blobs = [_placed_bytes(path[pos], kind, index) for pos, kind, _, index in self.items[upto0:upto]]
            else:
                kept, _, _ = _apply_omit(self.take(upto0, upto), settings, path_index)
                blobs = [
                    _placed_bytes(c.entry, c.kind, c.index) if item is c.item else canonical_bytes(item)
                    for c, item in kept
                ]
                for pos, kind, _, _ in self.items[upto0:upto]:
                    if kind == "item":
                        self.path[pos].item_bytes = None  # (an item left out: its bytes are not needed again)
            if blobs:
                if count:
                    h.update(b",")
                h.update(b",".join(blobs))  # (not added to the comma: the items are most of a request's bytes)
                count += len(blobs)
        if start is None or upto0 < upto:
            self.marks.append((sig, upto, self.items[upto - 1] if upto else None, count, h.copy()))
        if after:
            h.update(b"],")
            h.update(after)  # the settings after ``input`` (instructions, tools): large, not copied to add "}"
            h.update(b"}")
        else:
            h.update(b"]}")
        return HASH_PREFIX + h.hexdigest()

    def kept_mark(self, upto: int, settings: Settings) -> _Mark:
        """The mark of the first ``upto`` contributions under ``settings`` (no omit in force),
        made if none holds it: what a kept rules' state carries of the request hash
        (store/rulestate.py)."""
        if not settings.omit.zero:
            raise ContextError("a request hash state is kept only with no omit in force")
        self.hash_request(upto, settings, {})
        sig = (settings.request_split()[0],)
        for mark in reversed(self.marks):
            if mark[1] == upto and self._valid(mark, sig, upto):
                return mark
        raise ContextError(f"no request hash state after {upto} contribution(s)")  # (hash_request makes one)


def _placed_bytes(entry: Entry, kind: str, index: int) -> bytes:
    """The canonical bytes of the contribution of ``kind`` (and ``index``) that ``entry``
    makes: for an item, those its entry's hashing made (``item_bytes``, left on the entry
    until hashed into a mark, then dropped here; or dropped when a one-pass check parks
    it), else encoded again."""
    if kind == "item":
        raw = entry.item_bytes
        if raw is not None:
            entry.item_bytes = None
            return raw
    return canonical_bytes(_placed_item(entry, kind, index), parsed=True, careful=entry.careful)


# ---------------------------------------------------------------------------
# the builder


def output_entries(path: Sequence[Entry], response: Entry) -> list[Entry]:
    """The item entries on ``path`` holding ``response``'s own output, in path order
    (RFC 0001 "Request context of a response").

    Walking back from the end of ``path`` (which ends at the response, or just before
    it): an entry that is not an ``item`` is skipped, an item whose ``response`` names
    the response's ``response_id`` is an output, and the walk stops at the first item
    that names another response or none. A response without a ``response_id`` has none.
    """
    rid = _name(response.data.get("response_id"))
    if rid is None:
        return []
    found: list[Entry] = []
    for e in reversed(path):
        if e is response or e.type != "item":
            continue
        if e.data.get("response") == rid:
            found.append(e)
        else:
            break
    found.reverse()
    return found


def walk_outputs(path: Sequence[Entry], end: int, stop: int, rid: str) -> tuple[int, bool, bool, bool]:
    """The walk back from ``path[end - 1]`` to ``path[stop]`` that finds the output items of
    the response ``rid`` (RFC 0001 "Request context of a response"): entries that are not
    items are passed over, items naming ``rid`` are its outputs, the first item naming
    another response (or none) ends the walk. Returns the outputs that are contributions
    (their ``item`` an object), whether a compaction or branch summary lay among them
    (``slow``: only a rebuild of the path without them gets the request right; the walk
    stops there), whether one was passed at all (``crossed``), and whether the walk
    reached ``stop`` without ending (``through``: what lies above is yet to be walked)."""
    k = 0
    crossed = False
    for i in range(end - 1, stop - 1, -1):  # no slice: the path may be long
        d = path[i].data
        t = d.get("type")
        if t != "item":
            if t in ("compaction", "branch_summary"):
                crossed = True
            continue
        if d.get("response") != rid:
            return k, False, crossed, False
        if crossed:
            return k, True, crossed, False
        if isinstance(d.get("item"), dict):
            k += 1
    return k, False, crossed, True


class ContextBuilder:
    """The context algorithm, one entry at a time along a path.

    ``push`` adds the next entry of the path; ``pop`` takes the last one back, so a
    depth-first walk of a tree serves every entry with one builder. The settings
    are replayed as entries arrive, the last compaction is applied when it arrives
    (its kept range rebuilt from the path), and the item list is kept as a stack
    of contributions; :meth:`context` applies the omit in force at the tip.
    """

    def __init__(self) -> None:
        self.path: list[Entry] = []
        #: id -> position, for the entries on the path only.
        self.index: dict[str, int] = {}
        self._models: list[str | None] = []
        self.settings: Settings = EMPTY_SETTINGS
        self._raw = _Raw(self.path)
        #: (position of the last compaction, position of its first_kept or None)
        self.compaction: tuple[int, int | None] | None = None
        #: Why the context cannot be built while the last compaction is in force.
        self.error: str | None = None
        #: The ``of`` of an omitted ``keep`` in the config just pushed that the path cannot resolve.
        self.unresolved_of: str | None = None
        #: What each push changed, by position: the item count before it, an int alone
        #: when that is all (an entry first pushed, not a config nor a compaction: nearly
        #: every one, and a long path keeps one each: an int, not a pair holding one), else
        #: ``(previous index or None, item count)`` and, for a config or a compaction, the
        #: settings, item list, compaction and error it replaced.
        self._undo: list[int | tuple] = []

    # -- walking --------------------------------------------------------------

    def push(self, entry: Entry, t: Any = None) -> None:
        """Add ``entry`` (of type ``t``, read from it when not given) at the tip."""
        data = entry.data
        if t is None:
            t = data.get("type")
        path = self.path
        pos = len(path)
        eid = entry.id
        index = self.index
        items = self._raw.items
        if t == "config" or t == "compaction":
            self._undo.append((index.get(eid), len(items), self.settings, self._raw, self.compaction, self.error))
        else:
            # Only a config or a compaction changes the rest; an entry pushed for the first
            # time (not on the path already) leaves its item count alone.
            prev = index.get(eid)
            self._undo.append(len(items) if prev is None else (prev, len(items)))
        path.append(entry)
        index[eid] = pos
        self.unresolved_of = None
        if t == "item":
            if data.get("item").__class__ is dict or isinstance(data.get("item"), dict):
                items.append((pos, "item", self.settings.model, 0))
        elif t == "config":
            self.settings, self.unresolved_of = self.settings.apply_checked(data, entry.id)
        elif t == "branch_summary":
            summary = data.get("summary")
            if isinstance(summary, dict):
                self._raw.items.append((pos, "branch_summary", self.settings.model, 0))
        elif t == "compaction":
            self._compact(entry, pos)
        self._models.append(self.settings.model)

    def _compact(self, entry: Entry, pos: int) -> None:
        data = entry.data
        fk = data.get("first_kept")
        fk_pos = self.index.get(fk) if isinstance(fk, str) else None
        self.settings = Settings.from_checkpoint(data.get("config"))
        contributions: list[_Placed] = []
        summary = data.get("summary")
        if isinstance(summary, dict):
            contributions.append((pos, "summary", self.settings.model, 0))
        pinned = data.get("pinned")
        if isinstance(pinned, list):
            contributions.extend((pos, "pinned", self.settings.model, i) for i, p in enumerate(pinned) if isinstance(p, dict))
        if fk_pos is None or fk_pos >= pos:
            shown = fk if is_hash(fk) else json.dumps(fk)
            self.error = f"compaction {short_id(entry.id)}: first_kept {shown} names no entry on its path before it"
            self.compaction = (pos, None)
        else:
            self.error = None
            self.compaction = (pos, fk_pos)
            for p in range(fk_pos, pos):
                e = self.path[p]
                if e.type == "item":
                    item = e.data.get("item")
                    if isinstance(item, dict):
                        contributions.append((p, "item", self._models[p], 0))
                elif e.type == "branch_summary":
                    summary = e.data.get("summary")
                    if isinstance(summary, dict):
                        contributions.append((p, "branch_summary", self._models[p], 0))
        self._raw = _Raw(self.path, contributions)

    def pop(self) -> Entry:
        """Take the last entry of the path back, restoring the state before it."""
        entry = self.path.pop()
        self._models.pop()
        undo = self._undo.pop()
        raw = self._raw
        if isinstance(undo, int):
            prev_index, n = None, undo
        else:
            prev_index, n = undo[0], undo[1]
            if len(undo) > 2:
                self.settings, raw, self.compaction, self.error = undo[2:]
        if prev_index is None:
            del self.index[entry.id]
        else:
            self.index[entry.id] = prev_index
        if raw is self._raw:
            raw.truncate(n)
        else:
            self._raw = raw
        self.unresolved_of = None
        return entry

    def pop_to(self, keep: int) -> None:
        """Take the path back to its first ``keep`` entries, as many :meth:`pop` would: the
        state before the first entry taken was pushed, the settings, compaction and item
        list as the earliest config or compaction taken had found them."""
        path = self.path
        if keep >= len(path):
            return
        undos = self._undo[keep:]
        index = self.index
        if len(path) - keep > keep:
            # (more to take back than to keep, as a close standing at the head drops a long
            # branch: the index made again of the entries kept, each id at its last place,
            # as pushing them made it, in one step)
            index.clear()
            index.update(zip(map(ENTRY_ID, path[:keep]), range(keep)))
        else:
            for entry, undo in zip(reversed(path[keep:]), reversed(undos), strict=True):
                if isinstance(undo, int) or undo[0] is None:
                    del index[entry.id]
                else:
                    index[entry.id] = undo[0]
        del path[keep:]
        del self._models[keep:]
        del self._undo[keep:]
        for undo in undos:
            if not isinstance(undo, int) and len(undo) > 2:
                self.settings, self._raw, self.compaction, self.error = undo[2:]
                break
        first = undos[0]
        self._raw.truncate(first if isinstance(first, int) else first[1])
        self.unresolved_of = None

    def settings_positions(self, start: int = 0) -> list[int]:
        """The places on the path, from ``start`` on, of the config and compaction entries the
        settings in force fold (from the last compaction on): :func:`replay_settings` of
        those entries gives :attr:`settings`. (Read from the undo records: no entry is read.)"""
        undo = self._undo
        if self.compaction is not None:
            start = max(start, self.compaction[0])
        return [i for i in range(start, len(undo)) if (u := undo[i]).__class__ is tuple and len(u) > 2]

    def extend(self, entries: Iterable[Entry]) -> ContextBuilder:
        for e in entries:
            self.push(e)
        return self

    # -- results --------------------------------------------------------------

    def selected_entries(self) -> list[Entry]:
        if self.compaction is None or self.compaction[1] is None:
            return list(self.path)
        c, fk = self.compaction
        return [self.path[c]] + self.path[fk:c] + self.path[c + 1 :]

    def context(self, *, apply_omit: bool = True, hold_items: bool = True) -> Context:
        """The context at the tip of the path. Raises :class:`ContextError` when the
        last compaction's ``first_kept`` names no entry on the path before it.
        ``apply_omit=False`` gives the items the omit setting would leave out or change
        as they are recorded (a diagnosis, not a context the format defines).
        ``hold_items=False``: the items are read from their entries as each is asked
        for (:class:`_Items`), when no omit is in force (one is applied to all at once)."""
        from .results import Context, OmittedItem, ReplacedItem  # (loaded where a context is built: not by an append)

        if self.error is not None:
            raise ContextError(self.error)
        settings = self.settings if apply_omit else self.settings.without_omit()
        if not hold_items and settings.omit.zero:
            raw = self._raw.take(0, len(self._raw.items))
            return Context(self.settings, _Items(raw), self.selected_entries(), [c.entry for c in raw])
        kept, omitted, replaced = _apply_omit(self._raw.take(0, len(self._raw.items)), settings, self.index)
        return Context(
            self.settings, [item for _, item in kept], self.selected_entries(), [c.entry for c, _ in kept],
            [OmittedItem(*o) for o in omitted], [ReplacedItem(*r) for r in replaced],
        )

    def response_hash(self, *, keep_outputs: bool = False, apply_omit: bool = True) -> str:
        """The request hash of the response at the tip: its request context is the path
        with its own output items removed (raises :class:`ContextError`).
        ``keep_outputs`` and ``apply_omit=False`` give variants a diagnosis tries."""
        response = self.path[-1]
        rid = None if keep_outputs else _name(response.data.get("response_id"))
        return self._hash_before(len(self.path) - 1, rid, apply_omit)

    def request_hash_for(self, response_id: str | None) -> str:
        """The ``request_hash`` a response with ``response_id`` appended at the tip would
        verify with (its output items already pushed): what a writer that keeps a builder
        along its session records, without rebuilding the path for every call."""
        return self._hash_before(len(self.path), _name(response_id), True)

    def _outputs(self, end: int, rid: str | None) -> tuple[int, bool]:
        """How many contributions end ``path[:end]`` as ``rid``'s output items, and whether a
        compaction or branch summary lies among those items (see :func:`walk_outputs`)."""
        if rid is None:
            return 0, False
        k, slow, _, _ = walk_outputs(self.path, end, 0, rid)
        return k, slow

    def _hash_before(self, end: int, rid: str | None, apply_omit: bool) -> str:
        """The request hash over ``path[:end]`` with the output items of ``rid`` removed.

        The outputs are the last contributions unless a compaction or branch summary
        lies among them, which only a rebuild of the path without them gets right.
        """
        path = self.path
        k, slow = self._outputs(end, rid)
        settings = self.settings if apply_omit else self.settings.without_omit()
        if slow:
            outputs: set[int] = set()
            for i in range(end - 1, -1, -1):
                e = path[i]
                if e.type != "item":
                    continue
                if e.data.get("response") != rid:
                    break
                outputs.add(id(e))
            rebuilt = ContextBuilder().extend(e for e in path if id(e) not in outputs)
            ctx = rebuilt.context(apply_omit=apply_omit)
            return sha256_ref(request_bytes(settings, ctx.items))
        if self.error is not None:
            raise ContextError(self.error)
        return self._raw.hash_request(len(self._raw.items) - k, settings, self.index)


def build_context(path: Sequence[Entry]) -> Context:
    """The context at the end of a root-first path (raises :class:`ContextError`)."""
    return ContextBuilder().extend(path).context()


def context_at(sf: Any, entry_id: str) -> Context:
    """The context at an entry of a :class:`~agentsession_cas.reader.SessionFile` (or any
    object with a ``tree``): the request a model call appended after it would receive."""
    return build_context(sf.tree.path(entry_id))


def request_context(path: Sequence[Entry]) -> Context:
    """The context of the request that produced the response ``path`` ends at: the path
    with the response's own output items removed."""
    if not path or path[-1].type != "response":
        raise ContextError("a request context is built at a response entry")
    outputs = {id(e) for e in output_entries(path, path[-1])}
    return build_context([e for e in path if id(e) not in outputs])


def request_hash_for(path: Sequence[Entry], response: Mapping[str, Any]) -> str:
    """The ``request_hash`` a response not yet written would verify with, were it
    appended at the end of ``path`` (its output items already on it): the value a
    writer built on this library records."""
    rid = _name(response.get("response_id"))
    outputs: set[int] = set()
    if rid is not None:
        for e in reversed(path):
            if e.type != "item":
                continue
            if e.data.get("response") != rid:
                break
            outputs.add(id(e))
    return build_context([e for e in path if id(e) not in outputs]).request_hash()


# ---------------------------------------------------------------------------
# verification


@dataclass
class RequestCheck:
    """The check of one response's ``request_hash``.

    ``status`` is ``ok``, ``mismatch``, ``no-hash`` (nothing was checked: never
    reported as verified) or ``error`` (the request could not be rebuilt, or the
    recorded value is not a hash). For a mismatch ``reason`` says what differs as far
    as can be told: ``omit`` (the recorded hash is the request with the items the omit
    setting leaves out), ``outputs`` (with the response's own output items left in),
    ``other-response`` (it is the request rebuilt for another response), or None.
    """

    entry: Entry
    status: str
    recorded: Any = None
    computed: str | None = None
    reason: str | None = None
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status in ("mismatch", "error")

    def as_dict(self) -> dict[str, Any]:
        return {
            "entry": self.entry.id,
            "line": self.entry.line,
            "status": self.status,
            "recorded": self.recorded,
            "computed": self.computed,
            "reason": self.reason,
            "detail": self.detail,
        }

    def message(self) -> str:
        """What was found for this response, for a person (one line)."""
        if self.status == "ok":
            return "ok"
        if self.status == "no-hash":
            return "no hash recorded"
        if self.status == "error":
            return f"ERROR {self.detail}"
        return f"MISMATCH recorded {self.recorded}" + (f", {self.detail}" if self.detail else "")


#: How many mismatches of one walk get the variants that rebuild a request from
#: scratch tried on them; past that a mismatch is reported without them, so a file
#: whose every hash is wrong still verifies in linear time.
DIAGNOSE_LIMIT = 20


def check_tip(builder: ContextBuilder, broken: str | None = None, diagnose: bool = True) -> RequestCheck:
    """Check the response at the tip of ``builder``'s path; ``broken`` says why its path
    cannot be rebuilt (cut by a parent not held), and ``diagnose`` whether the variants
    that rebuild the request from scratch are tried on a mismatch."""
    response = builder.path[-1]
    recorded = response.data.get("request_hash")
    if recorded is None or recorded == "":  # absent, null or empty: nothing was recorded
        return RequestCheck(response, "no-hash")
    if not is_hash(recorded):
        return RequestCheck(response, "error", recorded, detail=f"request_hash {_show(recorded)} is not a sha256 hash")
    if broken is not None:
        return RequestCheck(response, "error", recorded, detail=broken)
    try:
        computed = builder.response_hash()
    except AgentSessionError as exc:
        return RequestCheck(response, "error", recorded, detail=str(exc))
    if computed == recorded:
        return RequestCheck(response, "ok", recorded, computed)
    check = RequestCheck(response, "mismatch", recorded, computed)
    if diagnose:
        try:
            if not builder.settings.omit.zero and builder.response_hash(apply_omit=False) == recorded:
                check.reason, check.detail = "omit", "the request with the items the omit setting leaves out"
            elif builder.response_hash(keep_outputs=True) == recorded:
                check.reason, check.detail = "outputs", "the request with the response's own output items left in"
        except AgentSessionError:
            pass
    return check


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)[:80]


def verify_response(path: Sequence[Entry]) -> RequestCheck:
    """Check the ``request_hash`` of the response ``path`` ends at."""
    if not path or path[-1].type != "response":
        raise ContextError("a request hash is checked at a response entry")
    return check_tip(ContextBuilder().extend(path))


# ---------------------------------------------------------------------------
# the context hash (RFC 0002 "Prefix caching")

_PROVENANCE = ("legacy_id", "normalised")
_ITEM_PROVENANCE = ("response", "source", "queued_from")
#: The members each contributing type's content loses (or, a compaction's
#: ``first_kept``, has replaced) before it is hashed: a content holding none of them
#: is hashed as it is.
_STRIPPED = {
    "item": frozenset(_PROVENANCE + _ITEM_PROVENANCE),
    "config": frozenset(_PROVENANCE),
    "compaction": frozenset(_PROVENANCE + ("first_kept",)),
    "branch_summary": frozenset(_PROVENANCE + ("from",)),
}
#: What the content hashed leaves out of the members given: the envelope's, and provenance.
_LEFT_OUT = frozenset(_PROVENANCE + ("id", "type", "parent", "parents", "ts"))
#: The members of an item entry whose stripped content is its item alone.
_ITEM_ALONE = _LEFT_OUT | frozenset(_ITEM_PROVENANCE) | {"item"}


def context_hash_step(
    parent_hash: str,
    type_: str,
    body: Mapping[str, Any],
    first_kept: tuple[str, str] | None = None,
    *,
    parsed: bool = False,
    careful: bool | None = None,
    item_bytes: bytes | None = None,
    content_hash: str | None = None,
) -> str:
    """The context hash at an entry, from its parent's (``NULL_CONTEXT_HASH`` for a root).

    An entry that does not contribute (a response, a record, an extension) takes its
    parent's. For a contributing one the hash is over ``[parent hash, type, content
    hash]``, the content stripped of provenance (``legacy_id``, ``normalised``; an
    item's ``response``, ``source``, ``queued_from``; a branch summary's ``from``) and,
    for a compaction, ``first_kept`` replaced by ``[context hash, type]`` of the entry
    it names when that entry is on the path (``first_kept``), else null.
    ``body`` is the entry's content (the envelope's members, when it holds them, are
    left out); ``parsed``/``careful`` are as
    :func:`~agentsession_cas.canonical.canonical_bytes` takes them, for a body read from
    a line. What the reader has spares an encoding: ``content_hash``, the hash of the
    content (an entry's ``content_hash``), is the stripped content's when nothing is
    stripped; ``item_bytes``, the canonical bytes of the content's ``item``
    (``Entry.item_bytes``), make the stripped content of an item entry that is its item
    alone once stripped.
    """
    if type_ not in CONTEXT_TYPES:
        return parent_hash
    if content_hash is not None and _STRIPPED[type_].isdisjoint(body):
        chash = content_hash  # the content as it is: its hash is known
    elif item_bytes is not None and type_ == "item" and _ITEM_ALONE.issuperset(body) and "item" in body:
        chash = sha256_ref(b'{"item":' + item_bytes + b"}")  # stripped, the content is its item alone
    else:
        content = {k: v for k, v in body.items() if k not in _LEFT_OUT}
        if type_ == "item":
            for k in _ITEM_PROVENANCE:
                content.pop(k, None)
        elif type_ == "branch_summary":
            content.pop("from", None)
        elif type_ == "compaction" and "first_kept" in content:
            content["first_kept"] = list(first_kept) if first_kept is not None else None
        chash = sha256_ref(canonical_bytes(content, parsed=parsed, careful=careful))
    # three plain strings (the type one of CONTEXT_TYPES): nothing to walk for
    return sha256_ref(canonical_bytes([parent_hash, type_, chash], parsed=True, careful=False))


class ContextHasher:
    """RFC 0002's context hash, computed as entries are fed in (a parent before its
    children), as a store computes it at append. It keeps each fed entry's hash, type
    and parent, so any entry's value can be served and a compaction's ``first_kept``
    can be looked for on its path. ``known``: where those are kept, by entry id (a dict
    unless given: ``show`` of a stored session keeps them by the entry's place in its
    outline, 32 bytes an entry)."""

    def __init__(self, known: MutableMapping[str, tuple[str, str, str | None]] | None = None) -> None:
        self._known = known if known is not None else {}

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._known

    def get(self, entry_id: str | None) -> str:
        """The context hash at an entry fed earlier (None: the empty context)."""
        if entry_id is None:
            return NULL_CONTEXT_HASH
        try:
            return self._known[entry_id][0]
        except KeyError:
            raise AgentSessionError(f"no context hash for {entry_id}: the entry was not fed") from None

    def _on_path(self, target: str, start: str | None) -> bool:
        seen: set[str] = set()
        current = start
        while current is not None and current not in seen:
            if current == target:
                return True
            seen.add(current)
            known = self._known.get(current)
            current = known[2] if known is not None else None
        return False

    def take(self, entry: Entry) -> str | None:
        """:meth:`feed` of the next entry in file order, or None when its parent was not
        fed (its path is cut: it has no context hash, nor have its descendants): what
        :func:`context_hashes` makes of each entry, for a caller that reads them one at a
        time (``show --json`` writes each as it is read)."""
        parent = entry.parent
        if parent is not None and parent not in self._known:
            return None
        return self.feed(entry)

    def feed(self, entry: Entry | Mapping[str, Any]) -> str:
        """Compute, remember and return the context hash at ``entry`` (an :class:`Entry` or
        an entry object with its ``id``); its parent must have been fed, or be null."""
        parsed, careful, item_bytes, chash = False, None, None, None
        eid: Any
        type_: Any
        parent: Any
        body: Mapping[str, Any]
        if isinstance(entry, Entry):
            # An Entry's members were parsed or hashed when it was made: known JSON, and
            # its content hash is its content's (the step leaves its envelope's members out).
            eid, type_, parent, body = entry.id, entry.type, entry.parent, entry.data
            parsed, careful, item_bytes, chash = True, entry.careful, entry.item_bytes, entry.content_hash or None
        else:
            eid, type_, parent = entry.get("id"), entry.get("type"), entry.get("parent")
            body = entry  # the step leaves the envelope's members out
        if not isinstance(eid, str) or not isinstance(type_, str):
            raise AgentSessionError("an entry needs a string id and type to be fed")
        parent_hash = self.get(parent)
        ref = None
        if type_ == "compaction":
            fk = body.get("first_kept")
            if isinstance(fk, str) and fk in self._known and self._on_path(fk, parent):
                ref = (self._known[fk][0], self._known[fk][1])
        value = context_hash_step(parent_hash, type_, body, ref, parsed=parsed, careful=careful, item_bytes=item_bytes,
                                  content_hash=chash)
        self._known[eid] = (value, type_, parent)
        return value


def context_hashes(entries: Iterable[Entry]) -> dict[str, str]:
    """The context hash at every entry, fed in file order (entries whose parent is not
    among them are skipped, with their descendants: :meth:`ContextHasher.take`)."""
    hasher = ContextHasher()
    out: dict[str, str] = {}
    for e in entries:
        h = hasher.take(e)
        if h is not None:
            out[e.id] = h
    return out
