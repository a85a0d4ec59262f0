"""tests/perf/device, in its smallest form: the random-weight Q4_0 GGUF writer, specchat's calibration
written as a cost-curve file, and a replay of a recorded answer under that curve, from the replay
cache alone. The prepared device check (tests/perf/device/README.md) runs the same code on a GPU machine
with an 8B and a 1B; this keeps it working where there is none."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

PERF = Path(__file__).resolve().parent / "perf"
for _p in (PERF, PERF / "device"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from measure_curve import curve_doc, dump_curve, measure_pair  # noqa: E402
from random_gguf import PRESETS, write_random_gguf  # noqa: E402
from replay_curves import from_file  # noqa: E402
from replay_draft import DraftTrace  # noqa: E402
from replay_hardware import FIXED_K, evaluate_case  # noqa: E402
from replay_planner import load_recorded, write_cache  # noqa: E402
from run_device import RECORDED  # noqa: E402

from specchat.decoding.calibration import K_MAX  # noqa: E402
from specchat.llama.engine import LlamaModel, LoadOptions  # noqa: E402


def test_the_real_size_presets_have_the_published_models_shapes() -> None:
    big, small = PRESETS["llama-8b"], PRESETS["llama-1b"]
    assert big.vocab == small.vocab  # one tokenizer: a valid pair
    assert big.n_params() == pytest.approx(8.03e9, rel=0.01)
    assert small.n_params() == pytest.approx(1.24e9, rel=0.01)
    assert big.file_bytes() / 2**30 == pytest.approx(4.2, rel=0.03)  # Llama 3 8B Q4_0 is 4.3-4.7 GB
    for name in ("small-target", "tiny-target"):
        assert PRESETS[name].vocab == PRESETS[name.replace("target", "draft")].vocab


def test_a_random_q4_0_gguf_has_its_shapes_and_gives_finite_logits(tmp_path: Path) -> None:
    shape = PRESETS["tiny-target"]
    path = write_random_gguf(tmp_path / "t.gguf", shape, seed=1)
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    q4_0 = gguf.GGMLQuantizationType.Q4_0
    assert {n for n, t in tensors.items() if t.tensor_type == q4_0} == {n for n, *_ in shape.matrices()}
    assert list(tensors["blk.0.ffn_down.weight"].shape) == [shape.n_ff, shape.n_embd]  # ggml order: (in, out)
    scales = tensors["blk.0.attn_q.weight"].data.reshape(-1, 18)[:, :2].copy().view("<f2")
    assert np.isfinite(scales).all() and (scales > 0).all()
    with LlamaModel(path, LoadOptions(n_ctx=256, gpu_layers=0)) as m:
        assert (m.n_vocab, m.n_layer) == (shape.vocab, shape.n_layer)
        toks = m.tokenize("hello, world")
        row = np.array(m.decode(toks, [len(toks) - 1])[0])
    assert np.isfinite(row).all() and 1.0 < float(row.std()) < 10.0  # a trained model's spread of logits


def _tiny_cache(path: Path) -> Path:
    """A replay cache of two short answers in two prompt sets (the format replay_planner writes)."""
    rnd = np.random.default_rng(0)
    cases, traces = {}, {}
    for name in ("a", "b"):
        prompt = [int(t) for t in rnd.integers(50, 300, 80)]
        output = prompt[20:40] + [int(t) for t in rnd.integers(50, 300, 20)]  # a copy, then new text
        cases[name] = [prompt, output, [float(g) for g in rnd.uniform(0, 4, len(output))]]
        traces[name] = [
            [bool(x) for x in rnd.random(len(output)) < 0.7],
            [float(x) for x in rnd.random(len(output))],
        ]
    curve = [0.1 + 0.01 * i for i in range(49)]
    write_cache(path, {"cases": cases, "margin": 0.0, "exact_n": 49, "curve": curve, "real_gaps": True,
                       "traces": traces, "sets": {"copy": ["a"], "scratch": ["b"]},
                       "categories": {"a": "edit", "b": "code"}})  # fmt: skip
    return path


def test_calibration_becomes_a_curve_file_that_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPECCHAT_HOME", str(tmp_path / "home"))  # measured now, not read from a cache
    target = write_random_gguf(tmp_path / "t.gguf", PRESETS["tiny-target"], seed=1)
    draft = write_random_gguf(tmp_path / "d.gguf", PRESETS["tiny-draft"], seed=2)
    m = measure_pair(target, draft, gpu_layers=0, n_ctx=1024, threads=1, say=lambda _m: None)
    assert len(m.verify) == K_MAX + 1 and min(m.verify) > 0 and m.draft > 0 and m.catch_up > 0
    assert m.exact_n >= 1 and m.tie_margin >= 0 and m.gpu_layers == 0
    doc = curve_doc(m, name="tiny CPU", hardware="this CPU", target="t", draft="d", sources=["a test"])
    path = tmp_path / "curve.json"
    path.write_text(dump_curve(doc))
    assert json.loads(path.read_text()) == json.loads(json.dumps(doc))
    (curve,) = from_file(path)
    assert curve.verify == pytest.approx(m.verify, rel=1e-3)  # the sizes between interpolate alike
    assert curve.draft == pytest.approx(m.draft, rel=1e-3)
    assert curve.catch_up == pytest.approx(m.catch_up, rel=1e-3)
    assert (curve.exact_n, curve.margin) == (m.exact_n, m.tie_margin)

    # replayed from a cache alone: no policy beats the hindsight bound under the measured curve
    rec = load_recorded(_tiny_cache(tmp_path / "cache.json.gz"))
    assert rec.sets == {"copy": ["a"], "scratch": ["b"]} and isinstance(rec.traces["a"], DraftTrace)
    res = evaluate_case(rec.cases["a"], rec.traces["a"], curve, rec.margin, rec.exact_n, seeds=1)
    assert 0 < res["auto"] <= res["bound"] * 1.0001
    assert all(res[f"llama n{k} p0"] <= res["bound"] * 1.0001 for k in FIXED_K)

    # and through replay_planner's command line, without a target: --cache, --curve, --curve-only
    import replay_planner

    argv = ["replay_planner.py", "--cache", str(tmp_path / "cache.json.gz"), "--hardware", "--curve",
            str(path), "--curve-only", "--seeds", "1"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    capsys.readouterr()
    replay_planner.main()
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| tiny CPU |")]
    assert table and "exact <= " in table[0]  # one row, under the measured curve and its own exactness


def test_the_recorded_replay_cache_replays_without_a_model() -> None:
    rec = load_recorded(RECORDED)
    assert set(rec.sets) == {"copy", "heldout", "scratch"}
    assert sum(map(len, rec.sets.values())) == len(rec.cases) == len(rec.traces) >= 28
    assert rec.real_gaps  # every position's top-2 gap: replays a GPU's inexact batches too
    for name, (prompt, output, gaps) in rec.cases.items():
        assert prompt and len(output) == len(gaps) == len(rec.traces[name].right), name
    assert RECORDED.stat().st_size < 2_000_000


def test_a_slimmed_wheel_keeps_the_package_and_one_copy_of_each_library(tmp_path: Path) -> None:
    import base64
    import hashlib
    import zipfile

    from slim_wheel import slim

    dist = "llama_cpp_python-0.3.36.dist-info"
    files = {
        "llama_cpp/__init__.py": b"",
        "llama_cpp/lib/libllama.so": b"A" * 100,
        "llama_cpp/lib/libllama.so.0.5.0": b"A" * 100,
        "lib/libllama.so": b"A" * 100,  # the top-level copies
        "include/llama.h": b"//",
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\n",
        f"{dist}/RECORD": b"stale\n",
    }
    wheel = tmp_path / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    out = slim(wheel, tmp_path / "out")
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        record = z.read(f"{dist}/RECORD").decode().splitlines()
        contents = {n: z.read(n) for n in names}
    assert "llama_cpp/__init__.py" in names and "llama_cpp/lib/libllama.so" in names
    assert not any(n.startswith(("lib/", "include/")) for n in names)
    for line in record[:-1]:  # every kept file with its hash, as pip's RECORD wants
        name, digest, size = line.split(",")
        want = base64.urlsafe_b64encode(hashlib.sha256(contents[name]).digest()).rstrip(b"=").decode()
        assert digest == f"sha256={want}" and int(size) == len(contents[name])
    assert record[-1] == f"{dist}/RECORD,," and len(record) == len(names)
