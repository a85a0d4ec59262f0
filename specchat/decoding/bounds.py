"""How much a constraint may ask for, checked before any grammar compiler sees it.

A request's `grammar`, `json_schema`, `response_format` or tool parameters become a GBNF grammar that
llama.cpp parses with a recursive-descent parser and walks at every token; a JSON schema first goes
through llama-cpp-python's converter, which writes every repetition out in Python. Neither bounds
what it is given: a few hundred bytes can ask for a billion repetitions (the converter fills the
memory), a grammar of twenty thousand nested groups overflows the parser's stack (the process dies),
and a huge `enum` keeps the model thread busy for minutes. So every constraint is measured here
first, by iterative walks whose cost is linear in the request, and refused with one line naming
the field and the limit when it asks for more than `Limits` allows.

The limits are generous for real agents' tools: each is at least ten times what the largest tool
schemas of the agent frameworks and MCP servers measured ask for (docs/server-api.md, limits), and
small enough that the grammar compiled from a schema within them is bounded in size (the converted
text is checked too) and in parse depth (a `{0,n}` repetition becomes n nested groups).

The JSON-schema vocabulary itself (a `maxLength` that is a number, a `type` that exists) is checked
by the `jsonschema` package against the 2020-12 meta-schema, after these bounds have made that walk
safe; what the converter cannot enforce is refused by the engine (specchat/llama/grammar.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: JSON-schema keywords whose integer value becomes that many repetitions in the grammar.
REPEAT_KEYWORDS = ("minItems", "maxItems", "minLength", "maxLength")
#: A regex quantifier `{m}`, `{m,}` or `{m,n}` (an escaped brace is skipped before matching).
_QUANTIFIER = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


class TooLarge(ValueError):
    """A constraint over a limit; `where` is the place inside it (`properties.name`), its end only
    when it is long."""

    def __init__(self, message: str, where: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.where = where if len(where) <= 120 else "…" + where[-119:]


@dataclass(frozen=True, slots=True)
class Limits:
    """The most a constraint may ask for (see the module docstring for why each exists)."""

    #: nesting of a schema's objects and arrays (the body's own nesting is bounded before this)
    depth: int = 100
    #: JSON values in one schema, keywords and their values all counted
    nodes: int = 50_000
    #: properties of one object (the converter's work grows with their square)
    properties: int = 400
    #: values of one `enum` (each is an alternative the grammar tracks at every token)
    enum: int = 1_000
    #: minItems / maxItems / minLength / maxLength (written as {m,n} repetitions: llama/schema_gbnf.py
    #: enforces up to 2,000,000 exactly)
    repeat: int = 2_000_000
    #: characters of one `pattern`
    pattern: int = 4_096
    #: a pattern's {m,n} (the converter writes a pattern's repetitions out, nested)
    pattern_repeat: int = 200
    #: characters of a GBNF grammar, given or converted from a schema
    grammar_chars: int = 4 << 20
    #: elements llama.cpp's parser expands a grammar to (each repetition written out)
    grammar_elements: int = 1_000_000
    #: nesting of a GBNF grammar's groups (llama.cpp's parser recurses once per level: a thread's
    #: 512 KiB stack, macOS's default, holds about a thousand)
    grammar_depth: int = 500
    #: a GBNF `{m,n}`: llama.cpp enforces counts up to 2,000 and silently drops a larger upper bound
    grammar_repeat: int = 2_000


DEFAULT_LIMITS = Limits()


def check_schema_bounds(schema: object, limits: Limits = DEFAULT_LIMITS) -> None:
    """Refuse a schema over `limits` (TooLarge naming the keyword, where it is, and the limit)."""
    stack: list[tuple[object, str, int]] = [(schema, "", 1)]
    nodes = 0
    while stack:
        node, where, depth = stack.pop()
        nodes += 1
        if nodes > limits.nodes:
            raise TooLarge(f"the schema has more than {limits.nodes:,} values; the limit is {limits.nodes:,}")
        if depth > limits.depth and isinstance(node, Mapping | list):
            raise TooLarge(f"the schema nests deeper than {limits.depth} levels", where)
        if isinstance(node, Mapping):
            _check_keywords(node, where, limits)
            stack.extend((v, _join(where, str(k)), depth + 1) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(node))


def _check_keywords(node: Mapping[str, Any], where: str, limits: Limits) -> None:
    """One schema object's own keywords."""
    for key in REPEAT_KEYWORDS:
        value = node.get(key)
        if _is_number(value) and value > limits.repeat:
            raise TooLarge(f"{key} is {value:g}; the most this server takes is {limits.repeat:,}", where)
    for low, high in (("minItems", "maxItems"), ("minLength", "maxLength")):
        lo, hi = node.get(low), node.get(high)
        if _is_number(lo) and _is_number(hi) and lo > hi:
            raise TooLarge(f"{low} {lo:g} is above {high} {hi:g}: nothing can match", where)
    enum = node.get("enum")
    if isinstance(enum, list) and len(enum) > limits.enum:
        raise TooLarge(f"enum has {len(enum):,} values; the most this server takes is {limits.enum:,}", where)
    props = node.get("properties")
    if isinstance(props, Mapping) and len(props) > limits.properties:
        raise TooLarge(
            f"properties has {len(props):,} entries; the most this server takes is {limits.properties:,}",
            where,
        )
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        check_pattern(pattern, limits, _join(where, "pattern"))


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_pattern(pattern: str, limits: Limits = DEFAULT_LIMITS, where: str = "pattern") -> None:
    """A regex's length and its quantifiers' counts."""
    if len(pattern) > limits.pattern:
        raise TooLarge(f"the pattern has {len(pattern):,} characters; the limit is {limits.pattern:,}", where)
    for count in _counts(re.sub(r"\\.", "", pattern)):
        if count > limits.pattern_repeat:
            raise TooLarge(
                f"a repetition of {count:,} in the pattern; the most is {limits.pattern_repeat:,}", where
            )


def _counts(text: str) -> list[int]:
    """Every number inside a `{m}`, `{m,}` or `{m,n}` quantifier of `text`."""
    return [int(n) for m in _QUANTIFIER.finditer(text) for n in m.groups() if n]


def check_gbnf_bounds(text: str, limits: Limits = DEFAULT_LIMITS) -> None:
    """Refuse a GBNF grammar over `limits`: its length, its groups' nesting, its {m,n} counts, and
    the size llama.cpp's parser expands it to.

    One pass over the text with the tokens of llama.cpp's grammar syntax (src/llama-grammar.cpp):
    strings "..." and character classes [...] with backslash escapes, comments from # to the end of
    the line, tokens <...>, names, groups. The parser writes `x{m,n}` out as n copies of x's
    elements (a string's characters, a class's ranges; a name or a group is one reference), so the
    expansion is counted as it will be, before any of it is allocated."""
    if len(text) > limits.grammar_chars:
        raise TooLarge(f"the grammar has {len(text):,} characters; the limit is {limits.grammar_chars:,}")
    depth = deepest = 0
    elements = len(text)  # every element the parser keeps comes from at least one character
    last = 1  # elements of the item a quantifier applies to
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"' or c == "[":
            close = '"' if c == '"' else "]"
            i += 1
            last = 0
            while i < n and text[i] != close:
                i += 2 if text[i] == "\\" else 1
                last += 1
        elif c == "#":
            while i < n and text[i] not in "\r\n":
                i += 1
        elif c == "<":
            end = text.find(">", i)
            i = n if end < 0 else end
            last = 1
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth -= 1
            last = 1  # a group becomes a rule of its own, referenced once
        elif c in "*+?":
            elements += 2 * last
        elif c == "{":
            end = text.find("}", i)
            counts = _counts(text[i : (n if end < 0 else end + 1)])
            for count in counts:
                if count > limits.grammar_repeat:
                    raise TooLarge(
                        f"the grammar repeats something {count:,} times; "
                        f"the most is {limits.grammar_repeat:,}"
                    )
            if len(counts) == 2 and counts[0] > counts[1]:  # llama.cpp counts n - m down as unsigned
                raise TooLarge(
                    f"the grammar's repetition {{{counts[0]},{counts[1]}}} has its bounds reversed"
                )
            elements += last * (max(counts, default=0) + 1)
            i = n if end < 0 else end
        elif c.isalnum() or c == "-":
            while i + 1 < n and (text[i + 1].isalnum() or text[i + 1] == "-"):
                i += 1
            last = 1
        i += 1
        if elements > limits.grammar_elements:
            raise TooLarge(
                f"the grammar expands to more than {limits.grammar_elements:,} elements; write its "
                "repetitions with fewer or shorter items"
            )
    if deepest > limits.grammar_depth:
        raise TooLarge(
            f"the grammar nests {deepest:,} groups deep; "
            f"the most this server takes is {limits.grammar_depth:,}"
        )


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key
