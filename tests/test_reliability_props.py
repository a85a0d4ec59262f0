"""Property tests (hypothesis) for the parts that take untrusted or arbitrary input.

- The incremental UTF-8 detokenizer: token pieces split multi-byte characters anywhere; what is shown
  must never contain half a character, and all of it together must be exactly the text.
- Registry parsing: any text, and any TOML shaped roughly like models.toml, either parses or raises
  the registry's own RegistryError (one line naming file and line), never anything else.
- Model references: whatever follows `hf:`, a resolved reference never points outside the cache.
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from specchat.cli.common import fail_line
from specchat.decoding.loop import Detokenizer
from specchat.errors import SpecchatError
from specchat.models.registry import Registry, RegistryError, registry_path, resolve
from specchat.models.registry_toml import parse_registry

# No example database (nothing written into the checkout) and no per-example deadline (CI jitter).
FAST = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------------------------------------
# Incremental UTF-8 detokenizer


class PieceModel:
    """A stand-in model whose token i is the i-th byte chunk: all Detokenizer asks of a model."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def token_bytes(self, token: int) -> bytes:
        return self.chunks[token]


@st.composite
def split_bytes(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """`data` cut at random positions (empty pieces allowed: some tokens render to nothing)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=len(data) + 3)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@st.composite
def text_and_pieces(draw: st.DrawFn) -> tuple[str, list[bytes]]:
    # many multi-byte characters: accents, CJK, emoji (4 bytes), combining marks
    text = draw(
        st.text(
            alphabet=st.one_of(
                st.characters(codec="utf-8"),
                st.sampled_from("éß中文😀👍🏽\u0301\u200d\ufeff"),
            ),
            max_size=40,
        )
    )
    return text, draw(split_bytes(text.encode("utf-8")))


@FAST
@given(text_and_pieces())
@example(("😀", [b"\xf0", b"\x9f", b"\x98", b"\x80"]))
@example(("aé", [b"a\xc3", b"", b"\xa9"]))
def test_detokenizer_never_shows_half_a_character(case: tuple[str, list[bytes]]) -> None:
    text, pieces = case
    detok = Detokenizer(PieceModel(pieces))  # type: ignore[arg-type]
    shown = ""
    for token in range(len(pieces)):
        shown += detok.piece(token)
        # everything shown so far is a prefix of the real text: no U+FFFD for a split character
        assert text.startswith(shown)
    shown += detok.flush()
    assert shown == text


@FAST
@given(st.binary(max_size=64).flatmap(lambda b: st.tuples(st.just(b), split_bytes(b))))
def test_detokenizer_on_invalid_bytes_matches_a_one_shot_decode(case: tuple[bytes, list[bytes]]) -> None:
    """Random models emit arbitrary bytes: the stream must equal decoding everything at once."""
    data, pieces = case
    detok = Detokenizer(PieceModel(pieces))  # type: ignore[arg-type]
    shown = "".join(detok.piece(t) for t in range(len(pieces))) + detok.flush()
    assert shown == data.decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------------------------
# Registry parsing


def toml_string(s: str) -> str:
    """A TOML basic string: escape quote, backslash and every control character TOML forbids raw."""
    out = []
    for ch in s:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return toml_string(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_string(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


ENTRY_KEYS = ["repo", "file", "params", "quant", "size", "family", "context", "license", "sha256", "draft"]
MIRROR_KEYS = ["package", "parts", "version", "chunk", "sha256"]

scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-3, 30),
    st.floats(),
    st.text(max_size=12),
    # the shapes real values take, and the characters that make templates and paths interesting
    st.sampled_from(
        [
            "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
            "org/repo",
            "../x",
            "org/../..",
            "m-q4_k_m.gguf",
            "../../x.gguf",
            "/etc/passwd.gguf",
            "sub/m.gguf",
            "Q4_K_M",
            "qwen2",
            "a" * 64,
            "part{n}",
            "p{n:02d}/x.bin",
            "{n.real}",
            "{n.__class__}",
            "{n[0]}",
            "{0}",
            "{",
            "}",
            "{n!r}",
            "{n:q}",
            "x",
            "small",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
aliases = st.one_of(st.sampled_from(["small", "big", "x", "Big", "a.gguf", "a/b", ""]), st.text(max_size=8))


@st.composite
def entry_tables(draw: st.DrawFn) -> dict[str, object]:
    keys = draw(st.lists(st.sampled_from([*ENTRY_KEYS, "verified", "szie"]), unique=True))
    table: dict[str, object] = {k: draw(values) for k in keys}
    if draw(st.booleans()):
        mirror_keys = draw(st.lists(st.sampled_from([*MIRROR_KEYS, "extra"]), unique=True))
        table["mirror"] = {k: draw(values) for k in mirror_keys}
    return table


@st.composite
def registry_docs(draw: st.DrawFn) -> str:
    """models.toml-like TOML: [models."ALIAS"] tables with any subset of keys and any values."""
    lines: list[str] = []
    if draw(st.booleans()):
        lines.append(f"schema = {toml_value(draw(st.one_of(st.just(1), values)))}")
    if draw(st.integers(0, 9)) == 0:
        lines.append(f"{toml_string(draw(st.text(max_size=6)))} = 1")
    models = draw(st.dictionaries(aliases, entry_tables(), max_size=3))
    for alias, table in models.items():
        mirror = table.pop("mirror", None)
        lines.append(f"[models.{toml_string(alias)}]")
        lines.extend(f"{toml_string(k)} = {toml_value(v)}" for k, v in table.items())
        if isinstance(mirror, dict):
            lines.append(f"[models.{toml_string(alias)}.mirror]")
            lines.extend(f"{toml_string(k)} = {toml_value(v)}" for k, v in mirror.items())
    return "\n".join(lines) + "\n"


VALID_ENTRY = {
    "repo": "org/repo",
    "file": "m-q4_k_m.gguf",
    "params": "1B",
    "quant": "Q4_K_M",
    "size": 10,
    "family": "qwen2",
    "context": 4096,
    "license": "mit",
}


def assert_parses_or_registry_error(text: str) -> Registry | None:
    try:
        reg = parse_registry(text)
    except RegistryError as err:
        # messages quote keys from the file, which may hold newlines: the CLI's line must stay one line
        assert "\n" not in fail_line(err), err.message
        return None
    for alias, entry in reg.models.items():
        assert entry.alias == alias and entry.size > 0 and entry.file.endswith(".gguf")
    return reg


@FAST
@given(st.text(max_size=200))
def test_registry_on_any_text(text: str) -> None:
    assert_parses_or_registry_error(text)


@settings(FAST, max_examples=40)
@given(registry_docs())
@example('"\\u000A" = 1\n')  # keys holding a newline end up quoted in the message
@example('[models."\\u000A"]\n')
def test_registry_on_random_toml(text: str) -> None:
    assert_parses_or_registry_error(text)


@FAST
@given(key=st.sampled_from(["package", "chunk", "version"]), value=scalars)
@example(key="chunk", value="{n.x}")
@example(key="chunk", value="{n[0]}")
@example(key="package", value="{n.__class__}")
@example(key="chunk", value="{n:{n.real}}")
def test_registry_mirror_templates(key: str, value: object) -> None:
    """The mirror's package/chunk fields are format templates: any of them is parsed or refused."""
    mirror = {"package": "pkg-part{n}", "parts": 2, "version": "1.0", "chunk": "d/part{n}.bin", key: value}
    doc = "\n".join(
        [
            '[models."small"]',
            *(f"{k} = {toml_value(v)}" for k, v in VALID_ENTRY.items()),
            f"sha256 = {toml_string('a' * 64)}",
            '[models."small".mirror]',
            *(f"{k} = {toml_value(v)}" for k, v in mirror.items()),
        ]
    )
    assert_parses_or_registry_error(doc)


@settings(FAST, max_examples=60)
@given(st.data())
def test_registry_mutations_of_the_real_file(data: st.DataObject) -> None:
    """The shipped models.toml with one value replaced, one key dropped, or one line cut."""
    lines = registry_path().read_text(encoding="utf-8").splitlines()
    key_lines = [i for i, line in enumerate(lines) if re.match(r"^\w+ = ", line)]
    i = data.draw(st.sampled_from(key_lines))
    action = data.draw(st.sampled_from(["replace", "drop", "cut"]))
    if action == "replace":
        key = lines[i].split(" = ", 1)[0]
        lines[i] = f"{key} = {toml_value(data.draw(values))}"
    elif action == "drop":
        del lines[i]
    else:
        lines[i] = lines[i][: data.draw(st.integers(0, len(lines[i])))]
    assert_parses_or_registry_error("\n".join(lines))


def test_registry_deeply_nested_toml_is_a_registry_error() -> None:
    assert_parses_or_registry_error("a = " + "[" * 100_000)


# --------------------------------------------------------------------------------------------------------
# References never leave the cache

path_parts = st.one_of(
    st.sampled_from(["..", ".", "", "org", "repo", "x.gguf", "..\\x.gguf", "C:", "~", "%2e%2e", "a..b"]),
    st.text(alphabet="./\\~:abcQ_-", max_size=6),
)


@FAST
@given(st.lists(path_parts, min_size=1, max_size=6), st.sampled_from(["", ".gguf"]))
def test_hub_references_stay_inside_the_cache(parts: list[str], suffix: str) -> None:
    spec = "hf:" + "/".join(parts) + suffix
    empty = Registry(models={})
    try:
        ref = resolve(spec, empty)
    except SpecchatError:
        return
    assume(ref.repo is not None)
    assert ref.repo is not None
    cache = Path("/cache/hub")
    repo_dir = cache / f"models--{ref.repo.replace('/', '--')}"
    assert ".." not in ref.repo.split("/") and ref.repo.count("/") == 1
    if ref.file is not None:
        target = (repo_dir / "snapshots" / "commit" / ref.file).resolve()
        assert target.is_relative_to(repo_dir / "snapshots" / "commit"), spec
