"""Constrained output in a request: OpenAI's `response_format` and llama-server's `json_schema` and
`grammar` body fields, checked and turned into a `GrammarSpec` (decoding/constraint.py).

Only the shape is checked here (no llama_cpp in server/): the engine compiles the spec on the model
thread (Backend.constraint), and a schema or grammar it cannot compile becomes a 400 naming the
field then, before the response starts (server/worker.py). What is accepted:

* `response_format: {"type": "text"}`: no constraint;
* `response_format: {"type": "json_object"}`: any JSON object (llama-server's extension: with a
  `schema`, that schema);
* `response_format: {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`: the
  schema (`strict` is accepted and changes nothing: every schema is enforced, or refused);
* `json_schema: {...}` (llama-server): that schema; `grammar: "..."` (llama-server): GBNF text.

At most one of them may constrain a request (as llama-server: "either json_schema or grammar").

Whatever constrains a request (these fields, or tool parameters under `tool_choice`) then passes
`check_spec` before the request is queued: decoding/bounds.py's limits on size, nesting and
repetitions, and for a schema the JSON-schema meta-schema (the `jsonschema` package), so nothing
unbounded or malformed reaches llama-cpp-python's converter or llama.cpp's parser.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..decoding.bounds import TooLarge, check_gbnf_bounds, check_schema_bounds
from ..decoding.constraint import GrammarSpec
from .fields import json_kind

FORMAT_TYPES = ("text", "json_object", "json_schema")


class BadFormat(ValueError):
    """A malformed constraint field; api.parse_request turns it into a 400 naming `param`."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def grammar_spec(body: Mapping[str, Any]) -> GrammarSpec | None:
    """The constraint a request body asks for, or None; BadFormat (naming the field) if malformed."""
    specs = [
        s for s in (_response_format(body.get("response_format")), _json_schema(body), _grammar(body)) if s
    ]
    if len(specs) > 1:
        raise BadFormat(
            f"{specs[0].param} and {specs[1].param} both constrain the output: give only one",
            param=specs[1].param,
        )
    return specs[0] if specs else None


def check_spec(spec: GrammarSpec | None) -> None:
    """Refuse a constraint over the bounds, or a schema that is not a JSON schema (BadFormat naming
    the field it came from)."""
    if spec is None:
        return
    try:
        if spec.kind == "gbnf":
            check_gbnf_bounds(spec.text)
        elif spec.schema is not None:
            check_schema_bounds(spec.schema)
            _check_meta(spec.schema, spec.param)
    except TooLarge as exc:
        at = f" (at {exc.where})" if exc.where else ""
        raise BadFormat(f"{spec.param}: {exc.message}{at}", param=spec.param) from None


def _check_meta(schema: Mapping[str, Any], param: str) -> None:
    """The schema against its draft's meta-schema, so that a `maxLength` that is not a count, a
    `type` that does not exist or a `required` that is not a list is a clear 400 rather than a
    failure deep inside the converter. A schema that names no draft (`$schema`) may be written to
    2020-12 or to draft 7 (`items` as a list, as OpenAI's and llama-server's examples still are):
    either passes."""
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import Draft7Validator, Draft202012Validator, validator_for

    drafts = [validator_for(schema)] if "$schema" in schema else [Draft202012Validator, Draft7Validator]
    first: SchemaError | None = None
    for draft in drafts:
        try:
            draft.check_schema(schema)
            return
        except SchemaError as exc:
            first = first or exc
    assert first is not None
    where = ".".join(str(p) for p in first.absolute_path)
    at = f" at {where}" if where else ""
    why = first.message if len(first.message) <= 200 else first.message[:200] + "…"
    raise BadFormat(f"{param} is not a valid JSON schema{at}: {why}", param=param)


def _response_format(value: object) -> GrammarSpec | None:
    if value is None:
        return None
    param = "response_format"
    if not isinstance(value, Mapping):
        raise BadFormat(f"response_format must be an object with a type, not {json_kind(value)}", param=param)
    kind = value.get("type")
    if kind not in FORMAT_TYPES:
        raise BadFormat(
            f"response_format.type must be one of {', '.join(FORMAT_TYPES)} (got {kind!r})", param=param
        )
    if kind == "text":
        return None
    if kind == "json_object":
        if value.get("schema") is None:
            return GrammarSpec("json_object", param=param)
        return GrammarSpec(
            "json_schema", schema=_schema(value["schema"], "response_format.schema"), param=param
        )
    wrapper = value.get("json_schema")
    if not isinstance(wrapper, Mapping):
        raise BadFormat("response_format.json_schema must be an object: {name, schema, strict}", param=param)
    if wrapper.get("name") is not None and not isinstance(wrapper.get("name"), str):
        raise BadFormat("response_format.json_schema.name must be a string", param=param)
    if wrapper.get("strict") is not None and not isinstance(wrapper.get("strict"), bool):
        raise BadFormat("response_format.json_schema.strict must be true or false", param=param)
    schema = wrapper.get("schema")
    schema = {} if schema is None else _schema(schema, "response_format.json_schema.schema")
    return GrammarSpec("json_schema", schema=schema, param=param)


def _json_schema(body: Mapping[str, Any]) -> GrammarSpec | None:
    value = body.get("json_schema")
    if value is None:
        return None
    return GrammarSpec("json_schema", schema=_schema(value, "json_schema"), param="json_schema")


def _grammar(body: Mapping[str, Any]) -> GrammarSpec | None:
    value = body.get("grammar")
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise BadFormat(f"grammar must be a string of GBNF rules, not {json_kind(value)}", param="grammar")
    return GrammarSpec("gbnf", text=value, param="grammar")


def _schema(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise BadFormat(
            f"{where} must be a JSON schema object, not {json_kind(value)}", param=where.split(".")[0]
        )
    return value
