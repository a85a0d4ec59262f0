"""The batch-invariance probe (specchat.llama.invariance) and what is stored of it with the build check.

The verdict logic is pure and tested on made-up cases; one test runs the probe's models through the
installed llama.cpp build and holds it to what that build claims: specchat's patched build (version
0.3.36+specchat.<queue>) must be bit-exact at every width, a stock build must part somewhere (it does
on every CPU we know: F16 from 2 rows, repacked Q4_K from 4, Q6_K and Q5_K from 8).
"""

from __future__ import annotations

import json

import pytest

from specchat.decoding.drafters import ModelDrafter
from specchat.decoding.events import Token
from specchat.decoding.loop import FixedK, Settings, generate
from specchat.llama import build, buildcheck, invariance, probe_model
from specchat.llama.buildcheck import PASS, CheckResult
from specchat.llama.engine import GGML_TYPE_BF16, LlamaModel, LoadOptions
from specchat.models.gguf import read_gguf

IDENT = {"key": "testbuild-inv", "version": "0.3.36+specchat.0123456789", "libraries": []}


def _case(name: str, first_bad: int = 0, *, kind: str = "matmul", **extra):
    return {"kind": kind, "case": name, "first_bad": first_bad, "row": 0, "diff": 0.03 if first_bad else 0.0,
            "max_width": 49, **extra}  # fmt: skip


def test_every_case_exact_at_every_width_passes_and_says_what_it_covered():
    verdict = invariance.decide(
        [_case("Q4_K (repacked)"), _case("Q6_K"), _case("attention (V f16)", kind="attention", tokens=640)]
    )
    assert verdict.passed and verdict.exact_rows == 49
    assert verdict.line() == (
        "verify batches: bit-exact up to 49 rows (Q4_K (repacked), Q6_K; attention to 640 KV cells)"
    )


def test_the_first_width_that_parts_bounds_the_exact_rows_and_every_breaking_case_is_named():
    verdict = invariance.decide([_case("Q6_K", 8), _case("Q4_K (repacked)", 4), _case("Q8_0")])
    assert not verdict.passed and verdict.status == "fail"
    assert verdict.exact_rows == 3
    assert "Q4_K (repacked) from 4 rows, Q6_K from 8 rows" in verdict.line()
    assert "Q8_0" not in verdict.breaks


def test_a_token_tree_that_parts_leaves_no_row_verified_and_is_named():
    verdict = invariance.decide(
        [_case("Q4_K (repacked)"), _case("token trees (V f16)", 15, kind="tree", row=7, tokens=600)]
    )
    assert verdict.status == "fail" and verdict.exact_rows == 1
    assert "token trees (V f16): node 7 of a 15-node tree" in verdict.line()
    passed = invariance.decide([_case("Q6_K"), _case("token trees (V bf16)", kind="tree", tokens=600)])
    assert passed.passed and passed.exact_rows == 49 and "token trees" in passed.line()


def test_a_probe_that_crashed_or_printed_no_report_could_not_run():
    crashed = invariance.from_output(-4, "step Q6_K, batches of 2..49 rows\n", "")
    assert crashed.status == "could not run" and "during Q6_K" in crashed.breaks
    assert invariance.from_output(0, "no json here\n", "").status == "could not run"
    good = invariance.from_output(0, "step x\n" + json.dumps({"cases": [_case("F16")]}), "")
    assert good.passed


def test_the_verdict_is_stored_with_the_build_check_and_read_back_for_the_planner():
    exact = invariance.decide([_case("Q4_K (repacked)"), _case("F16")])
    result = buildcheck.run_check(
        command=["true"],
        runner=lambda argv, timeout: (0, json.dumps({"cases": [
            {"type": "Q4_K", "variant": "extra buffers, 16 rows", "max_abs": 0.01, "scale": 4.0}]}), ""),
        identity=IDENT,
        exactness=lambda: exact,
    )  # fmt: skip
    assert result.status == PASS and result.exactness == exact
    again = buildcheck.stored_result(IDENT)
    assert again is not None and again.exactness == exact
    assert buildcheck.verified_exact_rows(IDENT) == 49


def test_a_failed_or_missing_invariance_probe_verifies_no_rows():
    failing = invariance.decide([_case("F16", 2)])
    buildcheck.record(CheckResult(PASS, "ok", key=IDENT["key"], invariance=invariance.to_row(failing)))
    assert buildcheck.verified_exact_rows(IDENT) == 0
    buildcheck.record(CheckResult(PASS, "ok", key=IDENT["key"]))  # checked before the probe existed
    assert buildcheck.verified_exact_rows(IDENT) == 0


def test_the_exactness_probe_is_skipped_when_the_build_itself_is_bad():
    called = []
    result = buildcheck.run_check(
        command=["true"],
        runner=lambda argv, timeout: (-4, "step Q4_K\n", ""),
        identity=IDENT,
        store=False,
        exactness=lambda: called.append(1) or invariance.decide([]),
    )
    assert result.bad and called == [] and result.exactness is None


def test_probe_models_of_every_probed_type_are_quantised_ggufs_with_kernel_friendly_shapes(tmp_path):
    for qtype, (ggml_type, _, _) in probe_model.GGML_TYPES.items():
        if qtype == "F32":
            continue
        info = read_gguf(probe_model.write_probe_gguf(tmp_path / f"{qtype}.gguf", qtype, n_ctx=768))
        assert not info.is_truncated and info.architecture == "llama"
        mats = [t for t in info.tensors if t.name != "token_embd.weight" and len(t.shape) == 2]
        assert len(mats) == 8 and all(t.ggml_type == ggml_type for t in mats), qtype
        # repack: rows % 8; AMX: rows % 32, columns % 256 for K-quants (see PROBE_SHAPES)
        assert all(t.shape[1] % 32 == 0 and t.shape[0] % 256 == 0 for t in mats)


def test_the_installed_build_is_as_exact_as_it_claims():
    """Real kernels: rows of batches against one-token decoding on the probe models (a subset of the
    widths `make install` checks, for time). A patched build must be exact; a stock one is not."""
    cases = invariance.probe_cases(
        cases=(("Q4_K", True), ("Q6_K", True), ("F16", True)),
        widths=(2, 4, 8, 9, 49),
        long_widths=(2, 16),
        say=lambda text: None,
    )
    verdict = invariance.decide(cases)
    if build.installed_queue() is not None:
        assert verdict.passed, verdict.line()
    else:
        assert verdict.status == "fail", "a stock llama.cpp build rounded every batch like one row"


def test_a_patched_build_is_rebuilt_by_the_patched_build_module_with_this_cpus_flags():
    argv, env = buildcheck.rebuild_command(
        "0.3.36+specchat.0123456789", cpuinfo="flags : avx avx2 fma f16c", cmake_args="-DGGML_CUDA=on"
    )
    assert argv[1:] == ["-m", "specchat.llama.build", "install", "--force"]
    assert "-DGGML_AVX2=ON" in env["CMAKE_ARGS"] and "-DGGML_CUDA=on" in env["CMAKE_ARGS"]
    stock, _ = buildcheck.rebuild_command("0.3.36", cpuinfo="flags : avx2", cmake_args="")
    assert "llama-cpp-python==0.3.36" in stock


@pytest.fixture
def queue(tmp_path):
    folder = tmp_path / "patches" / "llama.cpp"
    folder.mkdir(parents=True)
    (folder / "0002-b.patch").write_text("b")
    (folder / "0001-a.patch").write_text("a")
    return tmp_path


def test_the_patch_queue_is_applied_in_file_name_order_and_its_hash_names_its_bytes(queue):
    patches = build.patch_queue(queue)
    assert [p.name for p in patches] == ["0001-a.patch", "0002-b.patch"]
    before = build.local_version("0.3.36", patches)
    assert before.startswith("0.3.36+specchat.") and build.installed_queue(before) == before.split(".")[-1]
    (queue / "patches" / "llama.cpp" / "0002-b.patch").write_text("b changed")
    assert build.local_version("0.3.36", patches) != before
    assert build.installed_queue("0.3.36") is None


def test_the_wheel_cache_key_changes_with_cmake_args_and_cpu_but_not_with_spacing(queue):
    patches = build.patch_queue(queue)
    key = build.build_key("0.3.36", patches, "-DA=1  -DB=2", cpu="avx2")
    assert key == build.build_key("0.3.36", patches, "-DA=1 -DB=2", cpu="avx2")
    assert key != build.build_key("0.3.36", patches, "-DA=1", cpu="avx2")
    assert key != build.build_key("0.3.36", patches, "-DA=1 -DB=2", cpu="avx512f")


def test_the_repository_patch_queue_applies_to_the_pinned_sdist(tmp_path):
    """The queue against the pinned llama-cpp-python's vendored llama.cpp (the sdist `make install`
    downloaded into the build cache; without it there is nothing to apply to)."""
    sdist = build.cache_dir() / "sdist" / f"llama_cpp_python-{build.PINNED}.tar.gz"
    if not sdist.is_file():
        pytest.skip(f"{sdist} is not there (make install downloads it)")
    patches = build.patch_queue()
    assert len(patches) >= 3
    src = build.prepare_source(sdist, patches, tmp_path, build.local_version(build.PINNED, patches))
    init = (src / "llama_cpp" / "__init__.py").read_text()
    assert f'__version__ = "{build.local_version(build.PINNED, patches)}"' in init
    tiled = (src / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml-cpu" / "tiled" / "tiled.cpp").read_text()
    assert "GGML_TILED_MIN_ROWS" in tiled


def test_a_patch_that_does_not_apply_is_named(tmp_path):
    tree = tmp_path / "llama.cpp"
    tree.mkdir()
    (tree / "a.txt").write_text("one\n")
    bad = tmp_path / "0001-bad.patch"
    bad.write_text("--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-two\n+three\n")
    with pytest.raises(build.BuildError, match=r"0001-bad\.patch does not apply"):
        build.apply_patches(tree, [bad])


def _greedy(model, prompt, *, drafter=None, k=0, exact_rows=0):
    """(token ids, their log-probabilities) of a greedy generation on a fresh cache."""
    model.truncate(0)
    if drafter is not None:
        drafter.model.truncate(0)
    events = generate(
        model,
        prompt,
        drafters=[drafter] if drafter is not None else [],
        planner=FixedK(k),
        settings=Settings(max_tokens=LONG, logprobs=0, exact_rows=exact_rows),
    )
    tokens = [e for e in events if isinstance(e, Token)]
    return [t.id for t in tokens], [t.logprob.logprob for t in tokens]


LONG = 520  # tokens generated: the KV cache passes 512 cells (llama.cpp pads its view to 256)


@pytest.mark.parametrize("qtype", ["Q4_K"])
def test_greedy_speculative_output_equals_no_draft_bit_for_bit_at_every_verify_width(tmp_path, qtype):
    """The promise on a patched build: drafting with a draft that is always right (the target itself)
    makes every round verify k+1 rows, and each token and its log-probability -- the target's logits
    bit for bit -- equal one-token decoding's, at the widths where stock kernels switch and past 512
    KV cells. (Every width 2..49, and Q6_K/Q5_K/F16, are the invariance probe's: same kernels.)"""
    if build.installed_queue() is None:
        pytest.skip("a stock llama.cpp build: its batches part from one-token decoding (see above)")
    path = probe_model.write_probe_gguf(tmp_path / f"{qtype}.gguf", qtype, seed=5, n_ctx=1024)
    opts = LoadOptions(n_ctx=1024, gpu_layers=0, repack=True, type_v=GGML_TYPE_BF16)
    with LlamaModel(path, opts) as target, LlamaModel(path, opts) as draft:
        for m in (target, draft):  # random weights say end-of-text sooner or later: generate on
            m.is_eog = lambda token: False  # type: ignore[method-assign]
        prompt = [1, *target.tokenize("Once upon a time")]
        plain = _greedy(target, prompt)
        assert len(plain[0]) == LONG
        for k in (3, 8, 48):  # verify widths 4, 9, 49: where stock llama.cpp switches kernels, and the most
            spec = _greedy(target, prompt, drafter=ModelDrafter(draft, p_min=0.0), k=k, exact_rows=49)
            assert spec[0] == plain[0], f"k={k}: the tokens part at {_first_difference(spec[0], plain[0])}"
            assert spec[1] == plain[1], (
                f"k={k}: log-probabilities part at {_first_difference(spec[1], plain[1])}"
            )


def _first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
