"""llama.cpp's GBNF grammars as a `decoding.constraint.Constraint`, and JSON schemas turned into them.

A grammar is compiled once per request (`compile_grammar`: `llama_sampler_init_grammar` over the
target's vocabulary) and each answer walks a clone of it (`Grammar.start`: `llama_sampler_clone`), so
`n` answers share one parse. Checks go through `llama_sampler_apply` on a `llama_token_data_array`
backed by a numpy structured array laid out as `llama_token_data` (id, logit, p): the grammar sets a
forbidden token's logit to -inf, so one C call checks one token, a handful of candidates, or the
whole vocabulary, with no Python loop over 152k tokens. `llama_sampler_accept` advances the state.

Never accept a token the grammar forbids: llama.cpp throws a C++ exception there (or aborts, for an
end-of-generation token), which ends the process; `GrammarState.accept` checks first.

JSON schemas go through llama-cpp-python's converter (the port of llama.cpp's json-schema-to-grammar,
with lengths and item counts written as `{m,n}` repetitions: schema_gbnf.py); `json_object` uses its
`JSON_GBNF` (any JSON object). Both are bounded first (decoding/bounds.py). The converter quietly
ignores keywords it cannot express (number bounds, `not`, `uniqueItems`...), which would let output
through that the schema forbids, so `check_schema` refuses those first, naming the keyword and where.

Measured on the default target's 151,936-token vocabulary (tests/perf/grammar_cost.py): a check of
1-16 tokens takes a few microseconds, of 256 about 20 us, of the whole vocabulary 10-70 ms (more
inside a string, where nearly every token is allowed and its text must be walked); so the loop
checks the fewest it can (decoding/constraint.py). Details: docs/server-api.md, constrained output.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import tempfile
from collections.abc import Iterator, Mapping

import llama_cpp
import numpy as np
from llama_cpp.llama_grammar import JSON_GBNF

from ..decoding.bounds import TooLarge, check_gbnf_bounds, check_schema_bounds
from ..decoding.constraint import GrammarSpec
from ..errors import BadInput
from .engine import LlamaModel
from .schema_gbnf import schema_to_gbnf

#: numpy's view of llama.cpp's `llama_token_data` (checked against ctypes at import)
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
assert TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)

#: JSON-schema keywords the converter would silently drop (the output could break the schema)
UNSUPPORTED = frozenset(
    {
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "patternProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "unevaluatedProperties",
        "unevaluatedItems",
        "additionalItems",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
    }
)
#: a character in a JSON string as llama.cpp's converter has it (common/json-schema-to-grammar.cpp),
#: plus JSON's `\/` escape
JSON_CHAR = r"""char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4})"""
#: string formats the converter enforces
FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})
#: keywords whose value is a schema, a list of schemas, or a map of names to schemas
_ONE_OR_MORE = frozenset({"items", "additionalProperties"})
_SCHEMA_LISTS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions"})


class _OwnsSampler:
    """Holds a llama.cpp sampler and frees it once (close, or garbage collection)."""

    _sampler: int | None = None

    def close(self) -> None:
        if self._sampler is not None:
            llama_cpp.llama_sampler_free(self._sampler)
            self._sampler = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit llama_cpp may be gone already
            self.close()


class GrammarState(_OwnsSampler):
    """One answer's position in a grammar (a `decoding.constraint.Constraint`)."""

    def __init__(self, grammar: Grammar, sampler: int) -> None:
        self._grammar = grammar  # keeps the buffer, and through it the model's vocab, alive
        self._sampler: int | None = sampler

    def allowed(self, tokens: np.ndarray) -> np.ndarray:
        if self._sampler is None:
            raise RuntimeError("the grammar state is closed")
        return self._grammar._check(self._sampler, tokens)

    def accept(self, token: int) -> None:
        if not self.allowed(np.array([token], dtype=np.int32))[0]:
            raise ValueError(f"token {token} is not allowed by the grammar here")
        llama_cpp.llama_sampler_accept(self._sampler, token)


class Grammar(_OwnsSampler):
    """A GBNF grammar compiled for `model`'s vocabulary; `start()` gives a fresh state to walk.
    BadInput when llama.cpp cannot parse it (the message has its parser's reason when it gave one)."""

    def __init__(self, model: LlamaModel, gbnf: str) -> None:
        self._sampler: int | None = None
        if not gbnf.strip():
            raise BadInput("the grammar is empty")
        try:  # llama.cpp's parser recurses per group and writes repetitions out: bound both first
            check_gbnf_bounds(gbnf)
        except TooLarge as exc:
            raise BadInput(exc.message) from None
        vocab = model._vocab  # same package: the grammar reads token texts from the model's vocab
        with _stderr_captured() as said:
            sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        if not sampler:
            detail = " ".join(" ".join(said).split())[:300]
            raise BadInput(
                "llama.cpp could not parse the GBNF grammar"
                + (f": {detail}" if detail else " (an undefined rule, left recursion, or no `root` rule?)")
            )
        self._model = model
        self._sampler = sampler
        self.n_vocab = model.n_vocab
        self._buf = np.zeros(self.n_vocab, dtype=TOKEN_DATA)
        self._array = llama_cpp.llama_token_data_array(
            data=self._buf.ctypes.data_as(llama_cpp.llama_token_data_p), size=0, selected=-1, sorted=False
        )
        self._ref = ctypes.byref(self._array)

    def start(self) -> GrammarState:
        """A state at the grammar's start (a clone: the compiled grammar stays untouched)."""
        if self._sampler is None:
            raise RuntimeError("the grammar is closed")
        return GrammarState(self, llama_cpp.llama_sampler_clone(self._sampler))

    def _check(self, sampler: int, tokens: np.ndarray) -> np.ndarray:
        """Which of `tokens` the grammar in `sampler`'s state allows: one llama_sampler_apply."""
        n = len(tokens)
        if n > self.n_vocab:
            raise ValueError(f"{n} tokens to check, the vocabulary has {self.n_vocab}")
        buf = self._buf[:n]
        buf["id"] = tokens
        buf["logit"] = 0.0
        self._array.size = n
        self._array.selected = -1
        self._array.sorted = False
        llama_cpp.llama_sampler_apply(sampler, self._ref)
        return buf["logit"] == 0.0  # forbidden tokens were set to -inf


def compile_grammar(model: LlamaModel, spec: GrammarSpec) -> Grammar:
    """The grammar a request's `spec` stands for, compiled for `model` (BadInput when it cannot be)."""
    return Grammar(model, gbnf_for(spec))


def gbnf_for(spec: GrammarSpec) -> str:
    """GBNF text for a request's spec: the grammar itself, JSON_GBNF, or the converted schema."""
    if spec.kind == "gbnf":
        return spec.text
    if spec.kind == "json_object":
        return JSON_GBNF
    schema = spec.schema if spec.schema is not None else {}
    try:  # the converter recurses and writes every repetition out: bound what it is given first
        check_schema_bounds(schema)
    except TooLarge as exc:
        raise BadInput(f"{exc.message} (at {exc.where})" if exc.where else exc.message) from None
    check_schema(schema)
    try:
        gbnf = schema_to_gbnf(schema)
    except RecursionError:
        raise BadInput("the JSON schema nests too deeply (or refers to itself without end)") from None
    except (AssertionError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise BadInput(
            f"the JSON schema cannot be turned into a grammar: {exc or type(exc).__name__}"
        ) from None
    # the converter lets raw control characters into strings, which JSON forbids there (json.loads
    # refuses them): use llama.cpp's own rule for a string's character instead
    return "\n".join(JSON_CHAR if line.startswith("char ::= ") else line for line in gbnf.split("\n"))


def check_schema(schema: object, where: str = "") -> None:
    """Refuse what the converter cannot enforce (BadInput naming the keyword and where it is)."""
    at = f" (at {where})" if where else ""
    if isinstance(schema, bool):
        raise BadInput(f"a boolean schema{at} is not supported: use {{}} for any value")
    if not isinstance(schema, Mapping):
        raise BadInput(f"the JSON schema{at} must be an object, not {type(schema).__name__}")
    for key, value in schema.items():
        path = f"{where}.{key}" if where else key
        if key in UNSUPPORTED:
            raise BadInput(
                f"the JSON schema keyword `{key}`{at} is not supported: the grammar cannot enforce it"
            )
        if key == "format" and schema.get("type", "string") == "string" and value not in FORMATS:
            raise BadInput(
                f"the string format {value!r}{at} is not supported (supported: {', '.join(sorted(FORMATS))})"
            )
        if key == "$ref" and not (isinstance(value, str) and value.startswith("#/")):
            raise BadInput(f"the $ref {value!r}{at} is not supported: only refs inside the schema (#/...)")
        if key in _ONE_OR_MORE:  # a schema (items may also be a list of them)
            for i, sub in enumerate(value if isinstance(value, list) else [value]):
                if isinstance(sub, Mapping):
                    check_schema(sub, f"{path}[{i}]" if isinstance(value, list) else path)
        elif key in _SCHEMA_LISTS:
            if not isinstance(value, list):
                raise BadInput(f"`{key}`{at} must be an array of schemas")
            for i, sub in enumerate(value):
                check_schema(sub, f"{path}[{i}]")
        elif key in _SCHEMA_MAPS:
            if not isinstance(value, Mapping):
                raise BadInput(f"`{key}`{at} must be an object of schemas")
            for name, sub in value.items():
                check_schema(sub, f"{path}.{name}")


@contextlib.contextmanager
def _stderr_captured() -> Iterator[list[str]]:
    """What llama.cpp writes to fd 2 meanwhile (its grammar parser prints the reason there)."""
    said: list[str] = []
    try:
        saved = os.dup(2)
    except OSError:
        yield said
        return
    with tempfile.TemporaryFile() as tmp:
        try:
            os.dup2(tmp.fileno(), 2)
            yield said
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            said.append(tmp.read(4000).decode("utf-8", errors="replace"))
