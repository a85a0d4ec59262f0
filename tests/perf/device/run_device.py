"""One device check, start to end: random-weight GGUFs, specchat's calibration, the hardware replay.

1. writes a Llama-3-8B-shaped target and a Llama-3.2-1B-shaped draft, random Q4_0 weights, one
   tokenizer (random_gguf.py; speed depends on shapes and weight type, not on the weights);
2. loads both as `specchat run` does, all layers offloaded when the build can, and measures specchat's
   calibration: V(1..K_MAX+1), the draft's cost per drafted and caught-up token, the tie margin and
   the bit-exact batch size (measure_curve.py); prints it and writes it to OUT as a cost-curve file in
   the format of tests/perf/curves/;
3. replays the recorded answers (tests/perf/recorded/replay-cache.json.gz: 28 answers of
   qwen2.5-coder-1.5b with its 0.5b draft teacher-forced) under that curve: auto against fixed k,
   llama.cpp's defaults and best fixed setting and the hindsight bound (replay_hardware.report).

`--dry-run` runs the same path on a CPU with small models (tens of MB), no offload, a few answers
and one seed: a minute or two on two cores. tests/perf/device/README.md says how to run it on a
GPU machine (run.sh installs the carried wheels and finds the CUDA libraries first).

Usage:
  python tests/perf/device/run_device.py [--out DIR] [--dry-run] [--published] [--seeds N] [--jobs N]
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PERF = HERE.parent
ROOT = HERE.parents[2]
for p in (ROOT, PERF, HERE):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

RECORDED = PERF / "recorded" / "replay-cache.json.gz"

_T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:6.1f}s] {msg}", flush=True)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "curve"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("OUT") or "device-out"),
        help="where the curve file and the replay table go (default $OUT, else ./device-out)",
    )
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="small models on the CPU (no offload), 2 answers a set, 1 seed: the same path",
    )
    ap.add_argument("--target-preset", default=None, help="random_gguf.PRESETS name (default llama-8b)")
    ap.add_argument("--draft-preset", default=None, help="random_gguf.PRESETS name (default llama-1b)")
    ap.add_argument(
        "--models", type=Path, default=None, help="where to write the GGUFs (default: a temp dir)"
    )
    ap.add_argument("--gpu-layers", type=int, default=None, help="default: all when the build can offload")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--cache", type=Path, default=RECORDED, help="the recorded answers (replay_planner --cache)"
    )
    ap.add_argument("--limit", type=int, default=None, help="replay only the first N answers of each set")
    ap.add_argument("--seeds", type=int, default=None, help="auto's seeds per answer (default 24; dry run 1)")
    ap.add_argument("--jobs", type=int, default=None, help="replay processes (default: every core)")
    ap.add_argument(
        "--published",
        action="store_true",
        help="also replay tests/perf/curves/ and the recording CPU's curve, for comparison",
    )
    ap.add_argument("--skip-replay", action="store_true")
    args = ap.parse_args()
    dry = args.dry_run
    target_preset = args.target_preset or ("small-target" if dry else "llama-8b")
    draft_preset = args.draft_preset or ("small-draft" if dry else "llama-1b")
    gpu_layers = 0 if dry and args.gpu_layers is None else args.gpu_layers
    # with 6, one prompt set's cell moved by up to 3% between seed sets (docs/performance.md): the
    # device's 16 processes replay 24 in seconds
    seeds = args.seeds or (1 if dry else 24)
    limit = args.limit if args.limit is not None else (2 if dry else None)
    jobs = args.jobs or os.cpu_count() or 1
    args.out.mkdir(parents=True, exist_ok=True)
    # a fresh calibration cache: every figure below is measured now, none read from an earlier run
    home = Path(tempfile.mkdtemp(prefix="specchat-home-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    os.environ["SPECCHAT_HOME"] = str(home)

    from random_gguf import PRESETS, write_random_gguf

    from specchat.llama.devices import backend_info, device_memory, supports_gpu_offload

    info = backend_info()
    say(
        f"python {sys.version.split()[0]}, llama-cpp-python {info['llama_cpp_python']}, "
        f"GPU offload {'yes' if info['gpu_offload'] else 'no'}"
    )
    say(f"llama.cpp system info: {info['system_info']}")
    for d in device_memory():
        say(
            f"device: {d.kind} {d.name} {d.description}: {d.free_bytes / 2**30:.1f} of "
            f"{d.total_bytes / 2**30:.1f} GiB free"
        )
    if not dry and gpu_layers != 0 and not supports_gpu_offload():
        say(
            "this llama-cpp-python build cannot offload to a GPU (a CPU wheel; its CUDA libraries not found: "
            "run.sh's ldd lines; or CUDA found no device: the ggml_cuda_init line): stopping; --dry-run "
            "runs on the CPU"
        )
        return 2

    # 1. the models
    models = args.models or Path(tempfile.mkdtemp(prefix="specchat-gguf-"))
    if args.models is None:  # gigabytes on a device: gone at exit however the run ends
        atexit.register(shutil.rmtree, models, ignore_errors=True)
    tshape, dshape = PRESETS[target_preset], PRESETS[draft_preset]
    if tshape.vocab != dshape.vocab:
        raise SystemExit(f"{target_preset} and {draft_preset} have different vocabularies")
    paths = {}
    for role, preset, seed in (("target", target_preset, 1), ("draft", draft_preset, 2)):
        shape = PRESETS[preset]
        path = models / f"{preset}-q4_0.gguf"
        t = time.perf_counter()
        write_random_gguf(path, shape, seed=seed)
        say(
            f"wrote the {role}: {path} ({shape.label}, {shape.n_params() / 1e9:.2f}B parameters, "
            f"{path.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - t:.1f} s"
        )
        paths[role] = path

    # 2. specchat's calibration
    from measure_curve import curve_doc, curve_table, dump_curve, measure_pair

    say("calibrating as `specchat run` does (tie margin, exact rows, verify curve, draft cost)")
    m = measure_pair(paths["target"], paths["draft"], gpu_layers=gpu_layers, threads=args.threads, say=say)
    say("measured: " + ", ".join(f"{k} {v:.1f} s" for k, v in m.seconds.items()))
    for note in m.notes:
        say(note)
    print(curve_table(m), flush=True)
    if m.on_gpu:
        where = next((d.description or d.name for d in device_memory() if d.kind == "gpu"), "GPU")
        backend = "CUDA" if "CUDA" in (m.system_info + " ".join(m.devices)).upper() else "GPU"
    else:
        where, backend = f"CPU ({platform.machine()}, {os.cpu_count()} cores)", "CPU"
    offload = "all layers offloaded" if m.on_gpu else "no offload"
    size = tshape.label.split(" (")[0].removeprefix("llama ")
    name = f"{where}, {size}, measured{' (dry run)' if dry else ''}"
    today = datetime.date.today().isoformat()
    doc = curve_doc(
        m,
        name=name,
        hardware=f"{where} (llama.cpp's {backend} backend, {offload})",
        target=f"{tshape.label}, random weights",
        draft=f"{dshape.label}, random weights",
        sources=[
            f"measured on a GPU machine, random weights: tests/perf/device/run_device.py "
            f"(specchat's calibration), {today}"
            if not dry
            else f"dry run on a CPU, random weights: tests/perf/device/run_device.py --dry-run, {today}"
        ],
    )
    curve_path = args.out / f"curve-{slug(name)}.json"
    curve_path.write_text(dump_curve(doc))
    say(f"wrote {curve_path}")
    if args.models is None:  # the GGUFs are not needed past here (gigabytes on a device)
        for p in paths.values():
            p.unlink(missing_ok=True)

    # 3. the replay
    if args.skip_replay:
        return 0
    from replay_curves import from_file, measured_cpu, published
    from replay_hardware import report
    from replay_planner import load_recorded

    rec = load_recorded(args.cache)
    if limit is not None:
        rec.sets = {k: v[:limit] for k, v in rec.sets.items()}
        keep = {n for v in rec.sets.values() for n in v}
        rec.cases = {n: c for n, c in rec.cases.items() if n in keep}
        rec.traces = {n: t for n, t in rec.traces.items() if n in keep}
    curves = from_file(curve_path)
    if args.published:
        curves += measured_cpu(rec.curve, cached=False) + published()
    per_set = ", ".join(f"{k} {len(v)}" for k, v in rec.sets.items())
    say(
        f"replaying {len(rec.cases)} recorded answers ({per_set})"
        f" under {len(curves)} curve(s), {seeds} seed(s), {jobs} process(es); the recording's own tie margin "
        f"{rec.margin:.3g} and exact rows {rec.exact_n} apply to curves without their own"
        + ("" if rec.real_gaps else "; NOTE: no real top-2 gaps recorded")
    )
    t = time.perf_counter()
    table = report(rec.cases, rec.traces, rec.sets, curves, rec.margin, rec.exact_n, seeds=seeds, jobs=jobs)
    say(f"replayed in {time.perf_counter() - t:.1f} s")
    (args.out / "replay.md").write_text(
        f"# Replay under {name}\n\n{curve_table(m)}\n\n{table}\n\n"
        f"(tests/perf/device/run_device.py, {today}: {len(rec.cases)} answers from {args.cache.name}, "
        f"{seeds} seed(s); cells are simulated speed-ups over plain decoding, geomeans)\n"
    )
    say(f"wrote {args.out / 'replay.md'}; done in {time.perf_counter() - _T0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
