"""Tool calls, the answer side: finding calls in what the model wrote, holding back streamed text that
may be one, and OpenAI's shapes for them (`message.tool_calls`, `delta.tool_calls`).

The formats recognised, by what the model writes (the template is not needed to read them):

- Qwen2.5 / Hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call
  (a missing closing tag at the end of the answer is forgiven);
- Llama 3.x: a JSON object `{"name": ..., "parameters": {...}}` as the whole answer, or after
  `<|python_tag|>` (several separated by `;`);
- Gemma 3 and others without a format of their own: a ```` ```tool_code ```` block holding a Python
  call (`get_weather(city="Paris")`, `print(...)` around it allowed), or a ```` ```json ```` block;
- small models' deviations: a bare or fenced JSON object or array of them, with `arguments` or
  `parameters` (or OpenAI's own `{type: function, function: {...}}`), arguments as an object or a
  JSON string.

Only calls of declared tools (or the one tool_choice names) count; a block that is anything else is
text and is sent as such. A call is found in full text and in a stream alike: `ToolStream` releases
text that cannot begin a call at once and holds a possible call until it is complete (its closing tag
or fence, its JSON value's end), or to the end of the answer (after `<|python_tag|>`).
"""

from __future__ import annotations

import ast
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .responses import Reply
from .stops import Piece, take_pieces
from .tools import ToolSpec

TAG, TAG_END = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
FENCE = "```"
MARKERS = (TAG, PYTHON_TAG, FENCE)
#: fenced blocks that may hold a call (a ```python block is code, streamed as it comes)
CALL_FENCES = ("json", "tool_code", "tool_call", "")
#: text held back undecided beyond this is text after all (an unfinished JSON answer, say)
MAX_HELD = 16_384


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call as OpenAI sends it: an id, the function's name, its arguments as JSON text."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def new_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_tool_calls(text: str, spec: ToolSpec) -> tuple[str | None, list[ToolCall]]:
    """The answer's text outside calls (None when only calls) and its calls."""
    stream = ToolStream(spec)
    pieces = stream.feed([(text, "")]) + stream.flush()
    content = "".join(t for t, _ in pieces)
    if stream.calls:  # the text beside calls, without the newlines that separated them
        return content.strip() or None, stream.calls
    return content, stream.calls


class ToolStream:
    """Feed an answer's pieces as they come; get back the pieces safe to send as text now, while
    `calls` collects the calls found (each also returned by the `feed` or `flush` that found it,
    through `take_new`)."""

    def __init__(self, spec: ToolSpec) -> None:
        self.names = frozenset(spec.names)
        self.parallel = spec.parallel
        self.calls: list[ToolCall] = []
        self._held: list[Piece] = []
        self._text = ""
        self._spaces: list[Piece] = []  # whitespace released after or before calls: dropped if any
        self._sent_text = False
        self._new = 0

    def feed(self, pieces: Sequence[Piece]) -> list[Piece]:
        for p in pieces:
            if p[0]:
                self._held.append(p)
                self._text += p[0]
        return self._scan(final=False)

    def flush(self) -> list[Piece]:
        """At the end of the answer: undecided text is decided now."""
        out = self._scan(final=True)
        if not self.calls:  # whitespace kept back in case a call followed: it was text after all
            out += self._spaces
        self._spaces = []
        return out

    def take_new(self) -> list[tuple[int, ToolCall]]:
        """The calls found since the last take, with their index among the answer's calls."""
        out = list(enumerate(self.calls))[self._new :]
        self._new = len(self.calls)
        return out

    # --- scanning ---------------------------------------------------------------------------------------

    def _scan(self, *, final: bool) -> list[Piece]:
        out: list[Piece] = []
        while self._text:
            start = self._candidate(self._text, final=final)
            if start is None:
                out += self._release(len(self._text))
                break
            if start > 0:
                out += self._release(start)
                continue
            end, calls = self._decide(self._text, final=final)
            if end is None:  # still undecided: hold it (unless it grew too long to be a call)
                if len(self._text) > MAX_HELD:
                    out += self._release(len(self._text))
                break
            if calls:
                self._drop(end)
                self._spaces = []
                room = len(calls) if self.parallel else max(0, 1 - len(self.calls))
                self.calls.extend(
                    ToolCall(new_id(), n, json.dumps(a, ensure_ascii=False)) for n, a in calls[:room]
                )
            else:
                out += self._release(max(end, 1))
        return out

    def _candidate(self, text: str, *, final: bool) -> int | None:
        """Where the first possible call starts (a marker, a partial marker at the end, or a JSON value
        opening the answer), or None."""
        at_start = not self._sent_text  # nothing but calls and whitespace so far
        if at_start:
            body = text.lstrip()
            if body[:1] in ("{", "["):
                return 0
            if not body and not final:
                return 0  # only whitespace so far: a JSON answer may follow
        found = [i for i in (text.find(m) for m in MARKERS) if i >= 0]
        if not final:
            found += [len(text) - k for k in range(1, max(map(len, MARKERS))) if _partial(text[-k:])]
        return min(found) if found else None

    def _decide(self, text: str, *, final: bool) -> tuple[int | None, list[tuple[str, dict[str, Any]]]]:
        """For text that begins with a candidate: where the candidate ends (None: not known yet) and
        the declared-tool calls it holds (none: it is text)."""
        if text.startswith(TAG):
            close = text.find(TAG_END)
            if close < 0:
                return (len(text), self._json_calls(text[len(TAG) :])) if final else (None, [])
            return close + len(TAG_END), self._json_calls(text[len(TAG) : close])
        if text.startswith(PYTHON_TAG):  # to the end of the answer (Llama's <|eom_id|> ends it)
            if not final:
                return None, []
            body = text[len(PYTHON_TAG) :]
            calls = self._json_calls(body) or self._semicolon_calls(body) or self._python_calls(body)
            return len(text), calls
        if text.startswith(FENCE):
            return self._fenced(text, final=final)
        body = text.lstrip()
        if body[:1] in ("{", "["):
            skip = len(text) - len(body)
            try:
                _, stop = json.JSONDecoder().raw_decode(body)
            except ValueError:  # unfinished, or not JSON (the end decides)
                return (len(text), self._json_calls(body)) if final else (None, [])
            return skip + stop, self._json_calls(body[:stop])
        if not body:  # whitespace only
            return (len(text), []) if final else (None, [])
        return (len(text), []) if final else (None, [])  # a partial marker

    def _fenced(self, text: str, *, final: bool) -> tuple[int | None, list[tuple[str, dict[str, Any]]]]:
        line_end = text.find("\n", len(FENCE))
        if line_end < 0:
            return (len(text), []) if final else (None, [])
        lang = text[len(FENCE) : line_end].strip().lower()
        first = text[line_end + 1 :].lstrip()[:1]
        if lang not in CALL_FENCES or (lang == "" and first not in ("{", "[", "")):
            return line_end + 1, []  # a code block: its opening line is text, and so is what follows
        if lang == "" and not first and not final:
            return None, []
        close = text.find(FENCE, line_end + 1)
        if close < 0:
            return (len(text), self._fence_calls(lang, text[line_end + 1 :])) if final else (None, [])
        return close + len(FENCE), self._fence_calls(lang, text[line_end + 1 : close])

    def _fence_calls(self, lang: str, body: str) -> list[tuple[str, dict[str, Any]]]:
        if lang == "tool_code":
            return self._python_calls(body) or self._json_calls(body)
        return self._json_calls(body)

    # --- payloads ---------------------------------------------------------------------------------------

    def _json_calls(self, payload: str) -> list[tuple[str, dict[str, Any]]]:
        """Calls in a JSON object or array of them; [] unless every item is a declared tool's call.
        Qwen2.5's template shows the format as `{{"name": ...}}` (Python's escaping), and small models
        copy the doubled braces: one pair of them is forgiven."""
        try:
            value = json.loads(payload)
        except ValueError:
            inner = payload.strip()
            if not (inner.startswith("{{") and inner.endswith("}}")):
                return []
            try:
                value = json.loads(inner[1:-1])
            except ValueError:
                return []
        items = value if isinstance(value, list) else [value]
        out = []
        for item in items:
            call = self._json_call(item)
            if call is None:
                return []
            out.append(call)
        return out

    def _json_call(self, item: object) -> tuple[str, dict[str, Any]] | None:
        if not isinstance(item, dict):
            return None
        if isinstance(item.get("function"), dict):  # OpenAI's own {type: function, function: {...}}
            item = item["function"]
        name = item.get("name")  # type: ignore[union-attr]
        args = item.get("arguments", item.get("parameters", {}))  # type: ignore[union-attr]
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                return None
        if not isinstance(name, str) or name not in self.names or not isinstance(args, dict):
            return None
        return name, args

    def _semicolon_calls(self, payload: str) -> list[tuple[str, dict[str, Any]]]:
        """Llama 3.x's several calls after <|python_tag|>: JSON objects separated by `;`."""
        parts = [p for p in payload.split(";") if p.strip()]
        calls = [self._json_calls(p) for p in parts]
        return [c for cs in calls for c in cs] if len(parts) > 1 and all(calls) else []

    def _python_calls(self, code: str) -> list[tuple[str, dict[str, Any]]]:
        """Python calls with literal keyword arguments (`f(a=1)`, `print(f(a=1))`, `[f(), g()]`)."""
        try:
            tree = ast.parse(code.strip(), mode="exec")
        except (SyntaxError, ValueError):
            return []
        nodes: list[ast.expr] = []
        for stmt in tree.body:
            if not isinstance(stmt, ast.Expr):
                return []
            value = stmt.value
            nodes.extend(value.elts if isinstance(value, ast.List) else [value])
        out = []
        for node in nodes:
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                if len(node.args) != 1:
                    return []
                node = node.args[0]
            if not isinstance(node, ast.Call) or node.args:
                return []
            name = ast.unparse(node.func)
            if name not in self.names or any(k.arg is None for k in node.keywords):
                return []
            try:
                args = {str(k.arg): ast.literal_eval(k.value) for k in node.keywords}
            except ValueError:
                return []
            out.append((name, args))
        return out

    # --- pieces -----------------------------------------------------------------------------------------

    def _release(self, n: int) -> list[Piece]:
        """The first n characters go out as text; whitespace alone waits for what follows (none
        is sent next to calls: see flush)."""
        out = self._take(n)
        text = "".join(t for t, _ in out)
        if not text.strip():
            self._spaces.extend(out)
            return []
        out = [*self._spaces, *out]
        self._spaces = []
        self._sent_text = True
        return out

    def _drop(self, n: int) -> None:
        self._take(n)

    def _take(self, n: int) -> list[Piece]:
        self._text = self._text[n:]
        return take_pieces(self._held, n)


def _partial(tail: str) -> bool:
    """Whether `tail` (the end of the text) is the beginning of a marker, not a whole one."""
    return any(m.startswith(tail) and m != tail for m in MARKERS)


# --- OpenAI's shapes ---------------------------------------------------------------------------------------


def patch_message(choice: dict[str, Any], spec: ToolSpec) -> None:
    """A whole chat choice with its calls parsed out: `message.tool_calls`, `content` the text
    outside them (null when none), finish_reason `tool_calls`."""
    message = choice["message"]
    content, calls = parse_tool_calls(message.get("content") or "", spec)
    if not calls:
        return
    message["content"] = content.strip() if content else None
    message["tool_calls"] = [c.to_dict() for c in calls]
    choice["finish_reason"] = "tool_calls"


class StreamedCalls:
    """The tool-call side of a streamed chat request: a ToolStream per choice, and the chunks that
    carry its text and its calls (OpenAI's delta.tool_calls: the id, type and name first with empty
    arguments, then the arguments)."""

    def __init__(self, spec: ToolSpec) -> None:
        self.spec = spec
        self._streams: dict[int, ToolStream] = {}

    def delta(
        self, reply: Reply, index: int, pieces: Sequence[Piece], logprobs: object, progress: object
    ) -> list[dict[str, object]]:
        stream = self._streams.setdefault(index, ToolStream(self.spec))
        return self._chunks(reply, index, stream, stream.feed(pieces), logprobs, progress)

    def finish(self, reply: Reply, index: int, finish_reason: str) -> tuple[list[dict[str, object]], str]:
        """The chunks of what was still held, and the answer's finish_reason (`tool_calls` if any)."""
        stream = self._streams.setdefault(index, ToolStream(self.spec))
        chunks = self._chunks(reply, index, stream, stream.flush(), None, None)
        return chunks, "tool_calls" if stream.calls else finish_reason

    def _chunks(
        self,
        reply: Reply,
        index: int,
        stream: ToolStream,
        pieces: Sequence[Piece],
        logprobs: object,
        progress: object,
    ) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        if pieces or logprobs:
            out.append(reply.chunk(pieces, index=index, logprobs=logprobs, progress=progress))  # type: ignore[arg-type]
        for k, call in stream.take_new():
            head = reply.chunk(index=index)
            head["choices"][0]["delta"]["tool_calls"] = [  # type: ignore[index]
                {
                    "index": k,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                }
            ]
            args = reply.chunk(index=index)
            args["choices"][0]["delta"]["tool_calls"] = [
                {"index": k, "function": {"arguments": call.arguments}}
            ]  # type: ignore[index]
            out += [head, args]
        return out
