"""The request side's smallest pieces, shared by every wire-format module: the error a bad request
gets (`ApiError`), what a JSON value is called in a message, and the checks of one integer or boolean
field.

Their own module because every parser needs them (`api.py` for generation requests, `prompts.py`,
`tools.py`, `tokens.py`) and `api.py` needs those parsers: kept in `api.py`, each of them imported
`api.py` back. Pure functions over dicts, no HTTP.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

#: The two generation endpoints: /v1/chat/completions and /v1/completions.
Kind = Literal["chat", "completion"]


class ApiError(Exception):
    """A request the server will not serve, as OpenAI reports it: HTTP status + error object."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def json_kind(value: object) -> str:
    """What a JSON value is, as an error message says it: "a string", "an array", "null", ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def is_int(value: object) -> bool:
    """A JSON integer (Python's bool is an int, JSON's true is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_field(body: Mapping[str, Any], name: str, *, lo: int | None, hi: int | None = None) -> int | None:
    """The integer field `name` (None when absent or null), in [lo, hi]; 2.0 is taken as 2."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not is_int(value):
        raise ApiError(f"{name} must be an integer, not {json_kind(value)}", param=name)
    if lo is not None and value < lo:
        raise ApiError(f"{name} must be >= {lo} (got {value})", param=name)
    if hi is not None and value > hi:
        raise ApiError(f"{name} must be at most {hi} (got {value})", param=name)
    return int(value)


def bool_field(body: Mapping[str, Any], name: str, *, param: str | None = None) -> bool:
    """The boolean field `name` (False when absent or null); `param` names it in the error."""
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(f"{param or name} must be true or false, not {json_kind(value)}", param=param or name)
    return value
