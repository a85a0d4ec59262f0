"""JSON schema -> GBNF: llama-cpp-python's converter, with its length and item counts written as
llama.cpp's own `{m,n}` repetitions instead of spelled out.

The converter (`llama_cpp.llama_grammar.SchemaConverter`, the port of llama.cpp's
json-schema-to-grammar) writes `maxLength: n` as n nested optional groups, `(c (c (c ...)?)?)?`:
its text grows with n and so does the depth llama.cpp's recursive-descent parser must recurse to,
which overflows a thread's stack at a few thousand on some platforms. Real tool schemas ask for
`maxLength` 200,000 and `maxItems` 10,000. Here those two cases (a string's length, an array's item
count) are written with the GBNF repetition operator, which llama.cpp expands into a flat chain of
rules: the text stays a few lines and the nesting constant, whatever n is.

llama.cpp takes a count up to 2,000 exactly (MAX_REPETITION_THRESHOLD in src/llama-grammar.cpp;
above it, an upper bound is silently dropped), so a larger count is split into blocks of `BLOCK`:
`0..d` items is `blk{0,q-1} x{0,BLOCK-1} | blk{q} x{0,r}` with `blk ::= x{BLOCK}` and d = q*BLOCK + r.
Every count 0..d has a parse, no other does, and a prefix keeps a handful of parse stacks alive, not
one per way of splitting it. So counts up to BLOCK * 2,000 are enforced exactly; decoding/bounds.py
refuses larger ones before they get here. Everything else is the converter's own work, unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from llama_cpp.llama_grammar import (
    PRIMITIVE_RULES,
    RESERVED_NAMES,
    STRING_FORMAT_RULES,
    SchemaConverter,
)

#: The largest count llama.cpp's `{m,n}` enforces as written.
LLAMA_MAX_REPEAT = 2_000
#: Items in one block of a count above LLAMA_MAX_REPEAT.
BLOCK = 1_000
#: The largest count written exactly (decoding/bounds.py's `repeat` may not exceed it).
MAX_COUNT = BLOCK * LLAMA_MAX_REPEAT
#: Keys that send the converter's `visit` down another branch before a string or array one.
_EARLIER = ("$ref", "oneOf", "anyOf", "const", "enum")


def schema_to_gbnf(schema: Mapping[str, Any]) -> str:
    """GBNF text for `schema` (its local $refs resolved); the converter's exceptions pass through."""
    converter = _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    resolved = converter.resolve_refs(json.loads(json.dumps(schema)), "stdin")
    converter.visit(resolved, "")
    return converter.format_grammar()


class _Converter(SchemaConverter):
    """The converter with string lengths and array item counts written as `{m,n}` repetitions."""

    def visit(self, schema: Any, name: str) -> str:
        if isinstance(schema, Mapping) and not any(k in schema for k in _EARLIER):
            kind = schema.get("type")
            rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
            if _is_bounded_string(schema):
                char = self._add_primitive("char", PRIMITIVE_RULES["char"])
                body = self.repeat(char, schema.get("minLength", 0), schema.get("maxLength"), rule_name)
                return self._add_rule(rule_name, rf'"\"" {body} "\"" space')
            items = schema.get("items")
            is_array = kind == "array" or (kind is None and not _object_first(schema))
            if is_array and isinstance(items, Mapping):
                item = self.visit(items, f"{name}{'-' if name else ''}item")
                body = self.list_of(item, schema.get("minItems", 0), schema.get("maxItems"), rule_name)
                return self._add_rule(rule_name, f'"[" space {body} "]" space')
        return super().visit(schema, name)

    def list_of(self, item: str, lo: int, hi: int | None, name: str) -> str:
        """`lo`..`hi` of `item` separated by commas (hi None: no bound), as the converter's own
        `_build_repetition` with a separator, its counts written as repetitions."""
        if hi == 0:
            return ""
        following = self._add_rule(f"{name}-next", f'"," space {item}')
        rest = self.repeat(following, max(0, lo - 1), None if hi is None else hi - 1, name)
        return f"{item} {rest}" if lo > 0 else f"({item} {rest})?"

    def repeat(self, x: str, lo: int, hi: int | None, name: str) -> str:
        """`lo`..`hi` copies of the rule `x` (hi None: no bound), in llama.cpp's `{m,n}` syntax."""
        lo = int(lo)
        if hi is None and lo <= LLAMA_MAX_REPEAT:
            return f"{x}{{{lo},}}" if lo else f"{x}*"
        if hi is not None and int(hi) <= LLAMA_MAX_REPEAT:
            return f"{x}{{{lo},{int(hi)}}}"
        block = self._add_rule(f"{name}-block", f"{x}{{{BLOCK}}}")
        must = _times(block, lo // BLOCK) + _times(x, lo % BLOCK)
        if hi is None:
            return " ".join([*must, f"{x}*"])
        blocks, rest = divmod(int(hi) - lo, BLOCK)
        if blocks == 0:
            return " ".join([*must, f"{x}{{0,{rest}}}"])
        fewer = " ".join([*([f"{block}{{0,{blocks - 1}}}"] if blocks > 1 else []), f"{x}{{0,{BLOCK - 1}}}"])
        return " ".join([*must, f"({fewer} | {block}{{{blocks}}} {x}{{0,{rest}}})"])


def _times(x: str, n: int) -> list[str]:
    """`x` exactly n times, as the parts of a sequence (none for 0)."""
    return [f"{x}{{{n}}}"] if n else []


def _is_bounded_string(schema: Mapping[str, Any]) -> bool:
    """The converter's branch for `{"type": "string", "minLength"/"maxLength"}` (no pattern or
    format of its own, which the converter handles first)."""
    if schema.get("type") != "string" or "pattern" in schema:
        return False
    fmt = schema.get("format") or ""
    if re.match(r"^uuid[1-5]?$", fmt) or f"{fmt}-string" in STRING_FORMAT_RULES:
        return False
    return "minLength" in schema or "maxLength" in schema


def _object_first(schema: Mapping[str, Any]) -> bool:
    """Whether the converter reads a schema with no `type` as an object before an array."""
    extra = schema.get("additionalProperties")
    return (
        "properties" in schema
        or ("additionalProperties" in schema and extra is not True)
        or "allOf" in schema
    )
