#!/usr/bin/env python3
"""Benchmark: verifying a session file against bare JSON parsing of it.

Generates, deterministically (seeded), a realistic coding-agent session with
the project's own writer (:class:`agentsession_cas.SessionBuilder`), holds
its bytes in memory, and times in the same process, best of several
repetitions:

* **baseline**: split into lines, then ``json.loads(line.decode("utf-8"))``
  for every line, keeping the objects (as a reader holding the file would);
* **verify**: ``agentsession_cas.read_session_bytes(data)``: strict I-JSON
  parse, canonical JSON, the content hash and the id hash of every entry, the
  ``ts`` form, and the parent/parents/base rules. It must report no problem.

The target is verify <= 3.0x baseline. A missed target is a measurement, not
a failure: the exit status is 0 either way. It is 1 only when the generated
session does not verify clean (then the numbers mean nothing) and 2 on bad
arguments.

Run: ``make bench`` or ``.venv/bin/python tests/bench/bench_verify.py
[--quick | --entries N] [--repeat R] [--seed S] [--no-cli] [--profile]``.
"""

from __future__ import annotations

import argparse
import base64
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from random import Random

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

import agentsession_cas  # noqa: E402
from agentsession_cas import Header, SessionBuilder, format_ts, make_entry, read_session_bytes  # noqa: E402
from agentsession_cas.format.context import ContextBuilder  # noqa: E402
from agentsession_cas.format.reader import split_lines  # noqa: E402

TARGET = 3.0
DEFAULT_ENTRIES = 100_000
QUICK_ENTRIES = 10_000
SESSION_ID = "01995b2a-7c3e-7d10-8a4f-3b2c1d0e9f80"

# ---------------------------------------------------------------------------
# Deterministic content

_WORDS = (
    "the a to of and in is it that for on with as this be are by not we file function "
    "test tests error value return import module class method config path output input "
    "parser session entry hash line read write check build run fix bug change update "
    "add remove refactor handle case should would could need let me look at now first "
    "then next also because so which when where data bytes string list dict object type "
    "call result failing passing expected actual assert raise exception trace stack "
    "directory repository commit branch merge diff patch lint format compile install "
    "dependency version release cache index store tree node leaf parent child root"
).split()
_NON_ASCII = (
    "café", "naïve", "déjà-vu", "Größe", "straße", "über", "façade", "résumé",
    "日本語", "テスト", "中文", "한국어", "Ελληνικά", "русский", "→", "✓", "✗", "…", "—", "±", "µs",
)
_EMOJI = ("🙂", "🚀", "✅", "❌", "🐛", "🔥", "📦", "🎉", "👍", "🤔", "⚠️", "🧪")
_IDENT = (
    "read_session", "entry_hashes", "canonical_bytes", "split_lines", "SessionFile",
    "Tree", "resume_leaf", "make_entry", "check_parent", "Header", "loads", "is_valid_ts",
    "parse_config", "handle_request", "UserService", "fetch_rows", "render", "main",
)
_FILES = (
    "src/app/main.py", "src/app/models.py", "src/app/views.py", "src/app/util/io.py",
    "tests/test_models.py", "tests/test_views.py", "README.md", "pyproject.toml",
    "Makefile", "src/lib/parser.rs", "src/lib/lexer.rs", "web/src/App.tsx", "docs/design.md",
)
_MODELS = ("gpt-5-codex", "gpt-5", "gpt-5-mini", "o4-mini")


def _sentence(rng: Random, n: int, *, non_ascii: float = 0.0, emoji: float = 0.0) -> str:
    words = rng.choices(_WORDS, k=n)
    if non_ascii and rng.random() < non_ascii:
        for _ in range(rng.randint(1, 3)):
            words[rng.randrange(n)] = rng.choice(_NON_ASCII)
    if emoji and rng.random() < emoji:
        words.append(rng.choice(_EMOJI))
    words[0] = words[0].capitalize()
    return " ".join(words) + "."


def _paragraphs(rng: Random, sentences: int, **kw) -> str:
    out, para = [], []
    for _ in range(sentences):
        para.append(_sentence(rng, rng.randint(6, 22), **kw))
        if rng.random() < 0.25:
            out.append(" ".join(para))
            para = []
    if para:
        out.append(" ".join(para))
    return "\n\n".join(out)


def _code_line(rng: Random) -> str:
    kind = rng.random()
    ind = "    " * rng.randint(0, 3)
    if kind < 0.3:
        return f"{ind}{rng.choice(_IDENT)}({', '.join(rng.choices(_WORDS, k=rng.randint(0, 3)))})"
    if kind < 0.55:
        return f"{ind}{rng.choice(_WORDS)}_{rng.choice(_WORDS)} = {rng.choice(_IDENT)}.{rng.choice(_WORDS)}"
    if kind < 0.7:
        return f"{ind}if {rng.choice(_WORDS)} is not None and len({rng.choice(_WORDS)}) > {rng.randint(0, 99)}:"
    if kind < 0.8:
        return f"{ind}return {{\"{rng.choice(_WORDS)}\": {rng.randint(0, 9999)}, \"path\": \"{rng.choice(_FILES)}\"}}"
    if kind < 0.9:
        return f"{ind}# {_sentence(rng, rng.randint(3, 10), non_ascii=0.1)}"
    return ""


def _tool_output(rng: Random, size: int) -> str:
    """A shell/tool result of roughly ``size`` characters: source, test logs, diffs, listings."""
    kind = rng.random()
    lines: list[str] = []
    n = 0
    if kind < 0.35:  # file contents with line numbers
        start = rng.randint(1, 400)
        while n < size:
            line = f"{start + len(lines):>5}\t{_code_line(rng)}"
            lines.append(line)
            n += len(line) + 1
    elif kind < 0.6:  # test run
        while n < size:
            f = rng.choice(_FILES)
            ok = rng.random() < 0.92
            line = (
                f"{f}::test_{rng.choice(_WORDS)}_{rng.choice(_WORDS)} "
                f"{'PASSED' if ok else 'FAILED'} [{rng.randint(0, 100):>3}%]"
            )
            if not ok:
                line += f"\nE   AssertionError: assert {rng.randint(0, 99)} == {rng.randint(0, 99)}  ✗"
            lines.append(line)
            n += len(line) + 1
        lines.append(f"==== {rng.randint(1, 400)} passed, {rng.randint(0, 5)} failed in {rng.uniform(0.1, 90):.2f}s ====")
    elif kind < 0.8:  # a diff
        f = rng.choice(_FILES)
        lines += [f"diff --git a/{f} b/{f}", f"--- a/{f}", f"+++ b/{f}"]
        while n < size:
            a = rng.randint(1, 900)
            lines.append(f"@@ -{a},7 +{a},8 @@ def {rng.choice(_IDENT)}")
            for _ in range(rng.randint(3, 12)):
                line = rng.choice(" +-") + _code_line(rng)
                lines.append(line)
                n += len(line) + 1
    else:  # grep / ls output
        while n < size:
            line = f"{rng.choice(_FILES)}:{rng.randint(1, 2000)}:{_code_line(rng).strip()}"
            lines.append(line)
            n += len(line) + 1
    return "\n".join(lines)


def _tools(rng: Random, extra: int = 0) -> list[dict]:
    """Function tools with JSON-schema parameters, as a coding agent declares them."""
    tools = [
        {
            "type": "function",
            "name": "shell",
            "description": "Runs a shell command and returns its output. Always set workdir; avoid `cd`.",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "array", "items": {"type": "string"}, "description": "The command to execute"},
                    "workdir": {"type": "string", "description": "The working directory to execute the command in"},
                    "timeout_ms": {"type": "number", "description": "The timeout for the command in milliseconds"},
                    "with_escalated_permissions": {"type": "boolean"},
                    "justification": {"type": "string"},
                },
                "required": ["command"],
                "additionalProperties": False,
            },
        },
        {
            "type": "function",
            "name": "apply_patch",
            "description": "Use the `apply_patch` tool to edit files. " + _paragraphs(rng, 6),
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {"input": {"type": "string", "description": "The entire contents of the apply_patch command"}},
                "required": ["input"],
                "additionalProperties": False,
            },
        },
        {
            "type": "function",
            "name": "read_file",
            "description": "Reads a file from the local filesystem, with optional line offsets.",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "offset": {"type": ["integer", "null"], "minimum": 1},
                    "limit": {"type": ["integer", "null"], "minimum": 1, "maximum": 2000},
                },
                "required": ["path", "offset", "limit"],
                "additionalProperties": False,
            },
        },
        {
            "type": "function",
            "name": "update_plan",
            "description": "Updates the task plan shown to the user.",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {
                    "explanation": {"type": "string"},
                    "plan": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "step": {"type": "string"},
                                "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
                            },
                            "required": ["step", "status"],
                            "additionalProperties": False,
                        },
                    },
                },
                "required": ["plan"],
                "additionalProperties": False,
            },
        },
        {
            "type": "function",
            "name": "web_search",
            "description": "Searches the web and returns result snippets.",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "minLength": 1},
                    "max_results": {"type": "integer", "default": 5},
                },
                "required": ["query"],
            },
        },
    ]
    for i in range(extra):
        tools.append(
            {
                "type": "function",
                "name": f"mcp__{rng.choice(_WORDS)}__{rng.choice(_WORDS)}_{i}",
                "description": _sentence(rng, rng.randint(8, 30)),
                "parameters": {
                    "type": "object",
                    "properties": {w: {"type": rng.choice(["string", "integer", "boolean"])} for w in rng.sample(_WORDS, 4)},
                },
            }
        )
    return tools


class _Gen:
    """Drives a SessionBuilder through turns of a coding agent's loop."""

    def __init__(self, seed: int):
        self.rng = Random(seed)
        created = datetime(2026, 9, 17, 12, 0, 0, tzinfo=UTC)
        self.ns = int(created.timestamp()) * 1_000_000_000
        header = Header.new(
            SESSION_ID,
            created_at=format_ts(created),
            harness={"name": "bench-harness", "version": "1.2.3"},
            records=["label", "info"],
            cwd="/home/dev/project",
        )
        self.b = SessionBuilder(header)
        self.cb = ContextBuilder()
        self.n_calls = 0
        self.n_resp = 0
        self.model = _MODELS[0]
        self.user_turns: list[str] = []  # ids of user messages on the live path

    def ts(self) -> str:
        rng = self.rng
        self.ns += rng.randint(20_000_000, 20_000_000_000) + rng.randint(0, 999_999)
        sec, frac = divmod(self.ns, 1_000_000_000)
        dt = datetime.fromtimestamp(sec, tz=UTC)
        # Most writers hold micro- or milli-seconds; some a nanosecond clock.
        r = rng.random()
        if r < 0.5:
            frac -= frac % 1000
        elif r < 0.8:
            frac -= frac % 1_000_000
        return format_ts(dt, frac)

    def _follow(self, entry) -> None:
        """Keep the context builder on the builder's path: back up to the entry's
        parent (a branch leaves from an ancestor), then step onto the entry."""
        cb = self.cb
        while cb.path and cb.path[-1].id != entry.parent:
            cb.pop()
        cb.push(entry)

    def add(self, type_: str, **body) -> str:
        ts = self.ts()
        if type_ == "response" and body.pop("_hash", False):
            # A real request_hash: the request this response's context rebuilds to.
            probe = make_entry(type_, self.b.leaf, ts=ts, **body)
            self._follow(probe)
            body["request_hash"] = self.cb.response_hash()
            self.cb.pop()
        entry = self.b.append(type_, ts=ts, **body)
        self._follow(entry)
        return entry.id

    def config(self, full: bool) -> None:
        rng = self.rng
        body: dict = {"model": self.model}
        if full:
            body["instructions"] = _paragraphs(rng, rng.randint(25, 60), non_ascii=0.05)
            body["reasoning"] = {"effort": rng.choice(["low", "medium", "high"]), "summary": "auto"}
            body["text"] = {"verbosity": "medium", "format": {"type": "text"}}
            body["tools_added"] = _tools(rng, extra=rng.randint(0, 6))
            body["extra"] = {"parallel_tool_calls": True, "store": False, "include": ["reasoning.encrypted_content"]}
        else:
            if rng.random() < 0.5:
                body["tools_added"] = _tools(rng, extra=rng.randint(1, 3))[-2:]
            if rng.random() < 0.3:
                body["tools_removed"] = [rng.choice(["web_search", "update_plan"])]
        if rng.random() < 0.25:
            body["temperature"] = rng.choice([0.2, 0.7, 1.0, 0.35, 1.2])
        if rng.random() < 0.1:
            body["top_p"] = 0.95
        self.add("config", **body)

    def user(self) -> None:
        rng = self.rng
        text = _paragraphs(rng, rng.randint(1, 8), non_ascii=0.15, emoji=0.05)
        if rng.random() < 0.2:
            text += "\n\n```\n" + _tool_output(rng, rng.randint(200, 1500)) + "\n```"
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        self.user_turns.append(self.add("item", item=item))

    def model_call(self, final: bool) -> list[str]:
        """Output items of one model call, then its response. Returns the call_ids it made."""
        rng = self.rng
        self.n_resp += 1
        resp = f"resp_{rng.getrandbits(128):032x}"
        if rng.random() < 0.75:
            item = {
                "type": "reasoning",
                "id": f"rs_{rng.getrandbits(96):024x}",
                "summary": [
                    {"type": "summary_text", "text": "**" + _sentence(rng, 4) + "**\n\n" + _paragraphs(rng, rng.randint(1, 5))}
                ],
            }
            if rng.random() < 0.6:
                item["encrypted_content"] = base64.b64encode(rng.randbytes(rng.randint(300, 3000))).decode("ascii")
            self.add("item", item=item, response=resp)
        calls: list[str] = []
        if final or rng.random() < 0.15:
            length = rng.choice([1, 2, 3, 5, 8, 15, 30]) if not final else rng.randint(3, 40)
            text = _paragraphs(rng, length, non_ascii=0.2, emoji=0.08)
            if rng.random() < 0.3:
                text += "\n\n```python\n" + "\n".join(_code_line(rng) for _ in range(rng.randint(3, 40))) + "\n```"
            item = {
                "type": "message",
                "id": f"msg_{rng.getrandbits(96):024x}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
            self.add("item", item=item, response=resp)
        if not final:
            for _ in range(1 if rng.random() < 0.8 else rng.randint(2, 4)):
                self.n_calls += 1
                call_id = f"call_{self.n_calls:06d}{rng.getrandbits(64):016x}"
                name = rng.choices(["shell", "apply_patch", "read_file", "update_plan", "web_search"], [60, 15, 15, 5, 5])[0]
                if name == "shell":
                    cmd = rng.choice(["rg -n", "sed -n '1,200p'", "pytest -q", "ls -la", "git diff", "cat"])
                    args = {"command": ["bash", "-lc", f"{cmd} {rng.choice(_FILES)}"], "workdir": "/home/dev/project"}
                    if rng.random() < 0.3:
                        args["timeout_ms"] = rng.choice([10000, 60000, 120000])
                elif name == "apply_patch":
                    args = {"input": "*** Begin Patch\n*** Update File: " + rng.choice(_FILES) + "\n"
                            + _tool_output(rng, rng.randint(200, 2500)) + "\n*** End Patch"}
                elif name == "read_file":
                    args = {"path": rng.choice(_FILES), "offset": rng.randint(1, 300), "limit": 200}
                elif name == "update_plan":
                    args = {"plan": [{"step": _sentence(rng, 5), "status": rng.choice(["pending", "completed"])}
                                     for _ in range(rng.randint(2, 6))]}
                else:
                    args = {"query": _sentence(rng, rng.randint(3, 8), non_ascii=0.2)}
                item = {
                    "type": "function_call",
                    "id": f"fc_{rng.getrandbits(96):024x}",
                    "call_id": call_id,
                    "name": name,
                    "arguments": json.dumps(args, ensure_ascii=rng.random() < 0.5),
                    "status": "completed",
                }
                self.add("item", item=item, response=resp)
                calls.append(call_id)
        inp = rng.randint(2_000, 180_000)
        out = rng.randint(20, 4_000)
        reasoning = rng.randint(0, out)
        body = {
            "response_id": resp,
            "model": self.model,
            "status": "completed",
            "usage": {
                "input_tokens": inp,
                "input_tokens_details": {"cached_tokens": rng.randint(0, inp)},
                "output_tokens": out,
                "output_tokens_details": {"reasoning_tokens": reasoning},
                "total_tokens": inp + out,
            },
            "incomplete": None,
            "error": None,
            "latency_ms": rng.randint(300, 60_000),
        }
        if rng.random() < 0.5:
            body["_hash"] = True  # add() computes it from the context, as a harness would
        if rng.random() < 0.03:
            body["attempts"] = 2
        self.add("response", **body)
        return calls

    def outputs(self, calls: list[str]) -> None:
        rng = self.rng
        for call_id in calls:
            size = int(min(32_000, max(80, rng.lognormvariate(7.4, 1.0))))  # median ~1.6 KB
            self.add("item", item={"type": "function_call_output", "call_id": call_id, "output": _tool_output(rng, size)})

    def branch(self) -> None:
        """Go back to before an earlier user message and continue from there."""
        rng = self.rng
        b = self.b
        target = rng.choice(self.user_turns[-8:])
        parent = next(e for e in reversed(b.entries) if e.id == target).parent
        left = b.leaf
        summary = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Summary of the abandoned branch: " + _paragraphs(rng, rng.randint(2, 8))}],
        }
        entry = b.branch(parent, "branch_summary", ts=self.ts(), **{"from": left, "summary": summary})
        b.leaf = entry.id  # continue on the new branch
        self._follow(entry)
        self.user_turns = self.user_turns[: self.user_turns.index(target)]

    def run(self, count: int) -> tuple[bytes, list, str | None]:
        rng = self.rng
        b = self.b
        self.config(full=True)
        while len(b.entries) < count:
            r = rng.random()
            if r < 0.015 and len(self.user_turns) > 2:
                self.branch()
            elif r < 0.04:
                if rng.random() < 0.3:
                    self.model = rng.choice(_MODELS)
                self.config(full=rng.random() < 0.3)
            elif r < 0.05:
                self.add("label", target=rng.choice(b.entries[-50:]).id, label=rng.choice(["checkpoint", "good", "before-refactor"]))
            elif r < 0.055:
                self.add("info", name=_sentence(rng, rng.randint(2, 6), non_ascii=0.2))
            self.user()
            for _ in range(min(40, int(rng.expovariate(1 / 6)))):
                calls = self.model_call(final=False)
                self.outputs(calls)
            self.model_call(final=True)
        entries = b.entries[:count]
        data = b.header.canonical_line() + b"".join(e.canonical_line() for e in entries)
        return data, entries, entries[-1].id if entries else None


def generate(count: int, seed: int) -> tuple[bytes, list, str | None]:
    """The session's bytes, its entries (file order) and the leaf it must resume at."""
    return _Gen(seed).run(count)


# ---------------------------------------------------------------------------
# Timing


def baseline(data: bytes) -> list:
    """Bare parse: every line decoded and handed to json.loads, objects kept."""
    loads = json.loads
    return [loads(line.decode("utf-8")) for line in split_lines(data)]


def verify(data: bytes):
    return read_session_bytes(data, source="<bench>")


def best_of(fn, arg, repeat: int) -> tuple[float, object]:
    best = float("inf")
    result = None
    for _ in range(repeat):
        result = None
        gc.collect()
        t0 = time.perf_counter()
        result = fn(arg)
        dt = time.perf_counter() - t0
        best = min(best, dt)
    return best, result


def cli_time(data: bytes, repeat: int) -> tuple[float, int, str] | None:
    exe = shutil.which("agentsession", path=str(Path(sys.executable).parent)) or shutil.which("agentsession")
    if exe is None:
        return None
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        path = os.path.join(tmp, "session.jsonl")
        with open(path, "wb") as f:
            f.write(data)
        best = float("inf")
        rc, out = 0, ""
        for _ in range(repeat):
            t0 = time.perf_counter()
            proc = subprocess.run([exe, "verify", path], capture_output=True, text=True)
            best = min(best, time.perf_counter() - t0)
            rc, out = proc.returncode, (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
        return best, rc, out[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--entries", type=int, default=None, help=f"entries to generate (default {DEFAULT_ENTRIES})")
    size.add_argument("--quick", action="store_true", help=f"{QUICK_ENTRIES} entries")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions; the best is reported (default 3, 7 with --quick)")
    ap.add_argument("--seed", type=int, default=20260917, help="generator seed")
    ap.add_argument("--no-cli", action="store_true", help="skip timing `agentsession verify` on a temp file")
    ap.add_argument("--profile", type=int, nargs="?", const=25, metavar="N",
                    help="after timing, cProfile one verify and print the top N functions by tottime")
    args = ap.parse_args(argv)
    count = QUICK_ENTRIES if args.quick else (args.entries if args.entries is not None else DEFAULT_ENTRIES)
    if count < 1:
        ap.error("--entries must be at least 1")
    repeat = args.repeat or (7 if count <= QUICK_ENTRIES else 3)
    if repeat < 1:
        ap.error("--repeat must be at least 1")

    print(f"bench_verify: agentsession-cas {agentsession_cas.__version__}, Python {platform.python_version()} "
          f"({platform.python_implementation()}), {platform.machine()}, {os.cpu_count()} CPUs")
    t0 = time.perf_counter()
    data, entries, leaf = generate(count, args.seed)
    gen_s = time.perf_counter() - t0
    types: dict[str, int] = {}
    for e in entries:
        key = e.type if e.type != "item" else f"item/{e.data['item']['type']}"
        types[key] = types.get(key, 0) + 1
    del entries
    mix = ", ".join(f"{k} {v}" for k, v in sorted(types.items(), key=lambda kv: -kv[1]))
    print(f"session: {count} entries + header, {len(data) / 1e6:.1f} MB, seed {args.seed}, generated in {gen_s:.1f}s")
    print(f"  mix: {mix}")

    # One untimed verify first: correctness, and warm caches.
    sf = verify(data)
    problems = sf.all_problems()
    leaf_ok = sf.leaf == leaf
    if problems or len(sf.entries) != count or not leaf_ok:
        print(f"INVALID: verify found {len(problems)} problem(s), {len(sf.entries)} of {count} entries, "
              f"leaf {'ok' if leaf_ok else 'WRONG'}")
        for p in problems[:10]:
            print(f"  {p}")
        return 1
    print(f"verify: 0 problems, {len(sf.entries)} entries, resume leaf as written")
    del sf

    base_s, _ = best_of(baseline, data, repeat)
    ver_s, _ = best_of(verify, data, repeat)
    ratio = ver_s / base_s
    mb = len(data) / 1e6
    print(f"\nbest of {repeat}:")
    print(f"  baseline  json.loads per line : {base_s * 1000:9.1f} ms  {count / base_s:>10,.0f} entries/s  {mb / base_s:7.1f} MB/s")
    print(f"  verify    read_session_bytes  : {ver_s * 1000:9.1f} ms  {count / ver_s:>10,.0f} entries/s  {mb / ver_s:7.1f} MB/s")
    print(f"  ratio     verify / baseline   : {ratio:9.2f}x   (target <= {TARGET:.1f}x)")

    if not args.no_cli:
        cli_reps = 3 if count <= QUICK_ENTRIES else 2
        res = cli_time(data, cli_reps)
        if res is None:
            print("  cli       agentsession verify : skipped (agentsession not installed)")
        else:
            cli_s, rc, last = res
            print(f"  cli       agentsession verify : {cli_s * 1000:9.1f} ms  (best of {cli_reps}, process start and file "
                  f"read included; exit {rc})  ratio {cli_s / base_s:.2f}x baseline")
            if rc != 0:
                print(f"            cli said: {last}")

    met = ratio <= TARGET
    print(f"\nRESULT: target {'MET' if met else 'NOT MET'}: verify is {ratio:.2f}x bare parse (target <= {TARGET:.1f}x)")

    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        verify(data)
        prof.disable()
        print(f"\nprofile of one verify (cProfile adds overhead), top {args.profile} by tottime:")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
