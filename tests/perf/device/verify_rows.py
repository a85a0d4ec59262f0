"""Do verify batches round like one-token decoding on this build and device, and what do they cost?

For the installed llama-cpp-python and each model (the GGUFs given, else tiny probe models of several
weight types that it writes, the install probe's), at 300 and 1,500 KV cells (both sides of Metal's
1,024-cell attention bucket): every batch of k = 2..16 rows against the same k rows decoded one token
at a time, as max |d logit| and bit-exact or not; then, on one model (the first GGUF given, else a
random Llama-3.2-1B-shaped Q4_0 written here: a real size, so the timings mean something), the cost
of each width, V(k)/V(1), at both lengths (calibration.time_verify: interleaved passes, each size's
fastest). All layers are offloaded when the build can (a Metal or CUDA build); on a CPU it runs the
same on the CPU. A few minutes on a GPU; `--quick` is the small form the test suite runs on a CPU.

Prints markdown tables and writes them with the figures as JSON to OUT (default ./device-out).
Run it once as is and once with GGML_METAL_VERIFY_ROWS=0 to see what patch 0005 changes on a Mac.

Usage:
  python tests/perf/device/verify_rows.py [GGUF ...] [--types Q4_K,Q6_K,Q8_0,F16,Q4_0]
      [--contexts 300,1500] [--max-rows 16] [--gpu-layers N] [--preset llama-1b] [--out DIR] [--quick]
  SCRIPT=verify_rows.py bash tests/perf/device/run.sh   (with the carried wheels, as on a CUDA machine)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
for p in (ROOT, HERE):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

#: the weight types the install probe covers (specchat/llama/invariance.py), the ones real GGUFs use
TYPES = ("Q4_K", "Q6_K", "Q8_0", "F16", "Q4_0")
CONTEXTS = (300, 1500)
MAX_ROWS = 16


@dataclass(slots=True)
class Rows:
    """One model at one context length: per k (1..max), max |d logit| against one-token decoding."""

    model: str
    cells: int
    diff: list[float] = field(default_factory=list)  # diff[k - 1]; k = 1 is the reference itself

    def exact_to(self) -> int:
        """The largest k such that every batch of 1..k rows was bit-exact."""
        return next((k for k, d in enumerate(self.diff) if d != 0.0), len(self.diff))


def compare_rows(model: Any, cells: int, max_rows: int) -> list[float]:
    """max |d logit| of a batch of k rows after `cells` tokens against the same rows decoded one token
    at a time, for k = 1..max_rows (the cache holds `cells` tokens of a fixed sequence first)."""
    import numpy as np

    probe = [(i * 7919) % max(1, model.n_vocab - 16) + 8 for i in range(cells + max_rows)]
    model.truncate(0)
    model.decode(probe[:cells], [])
    rows = probe[cells:]
    singles = np.stack([np.array(model.decode([t], [0])[0], copy=True) for t in rows])
    model.truncate(cells)
    out = [0.0]
    for k in range(2, max_rows + 1):
        got = np.array(model.decode(rows[:k], list(range(k))), copy=True)
        model.truncate(cells)
        out.append(float(np.abs(got - singles[:k]).max()))
    model.truncate(0)
    return out


def cost_curve(model: Any, cells: int, max_rows: int, reps: int) -> list[float]:
    """V(k)/V(1) for k = 1..max_rows after `cells` tokens (every size measured)."""
    from specchat.decoding.calibration import time_verify

    probe = [(i * 104729) % max(1, model.n_vocab - 16) + 8 for i in range(cells)]
    model.truncate(0)
    model.decode(probe, [])
    curve, _spread = time_verify(model, max_rows, reps=reps, sizes=range(1, max_rows + 1))
    model.truncate(0)
    return [v / curve[0] for v in curve]


def _load(path: Path, n_ctx: int, gpu_layers: int | None) -> Any:
    from specchat.llama.engine import LlamaModel, LoadOptions

    return LlamaModel(path, LoadOptions(n_ctx=n_ctx, gpu_layers=gpu_layers))


def _cell(d: float) -> str:
    return "0 (exact)" if d == 0.0 else f"{d:.2g}"


def exact_table(results: Sequence[Rows]) -> str:
    head = "| k | " + " | ".join(f"{r.model}, {r.cells} cells" for r in results) + " |"
    lines = [head, "|---" * (len(results) + 1) + "|"]
    for k in range(1, max(len(r.diff) for r in results) + 1):
        cells = ["reference" if k == 1 else _cell(r.diff[k - 1]) for r in results]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cost_table(name: str, costs: dict[int, list[float]]) -> str:
    lengths = sorted(costs)
    lines = [
        f"| k | {' | '.join(f'V(k)/V(1), {n} cells' for n in lengths)} |",
        "|---" * (len(lengths) + 1) + "|",
    ]
    for k in range(1, max(len(c) for c in costs.values()) + 1):
        lines.append(f"| {k} | " + " | ".join(f"{costs[n][k - 1]:.2f}" for n in lengths) + " |")
    return f"cost of each width on {name}:\n" + "\n".join(lines)


def build_facts() -> dict[str, Any]:
    from specchat.llama.devices import backend_info

    info = backend_info()
    return {
        "llama_cpp_python": str(info["llama_cpp_python"]),
        "gpu_offload": bool(info["gpu_offload"]),
        "system_info": str(info["system_info"]),
        "GGML_METAL_VERIFY_ROWS": os.environ.get("GGML_METAL_VERIFY_ROWS", "(unset)"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", nargs="*", type=Path, help="models to check (default: probe models it writes)")
    ap.add_argument("--types", default=",".join(TYPES), help="probe models' weight types, without GGUFs")
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)), help="KV cells before the batches")
    ap.add_argument("--max-rows", type=int, default=MAX_ROWS)
    ap.add_argument("--gpu-layers", type=int, default=None, help="default: all where the build can offload")
    ap.add_argument(
        "--preset", default=None, help="random_gguf preset timed without GGUFs (default llama-1b)"
    )
    ap.add_argument("--reps", type=int, default=3, help="timing passes per width")
    ap.add_argument("--no-cost", action="store_true", help="the exactness table only")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "device-out"))
    ap.add_argument("--quick", action="store_true", help="tiny everything, for the test suite on a CPU")
    args = ap.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",")]
    if args.quick:
        contexts, args.max_rows, args.types, args.reps = [40, 80], min(args.max_rows, 5), "Q4_K", 1
    preset = args.preset or ("tiny-target" if args.quick else "llama-1b")
    n_ctx = max(contexts) + args.max_rows + 64
    t0 = time.perf_counter()

    facts = build_facts()
    print(
        f"llama-cpp-python {facts['llama_cpp_python']}, GPU offload {'yes' if facts['gpu_offload'] else 'no'}"
    )
    print(f"llama.cpp system info: {facts['system_info']}")
    print(f"GGML_METAL_VERIFY_ROWS={facts['GGML_METAL_VERIFY_ROWS']}", flush=True)

    from specchat.llama.probe_model import write_probe_gguf

    results: list[Rows] = []
    costs: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="specchat-verify-rows-") as tmp:
        models = [(p.name, p) for p in args.gguf] or [
            (f"{t} (probe)", write_probe_gguf(Path(tmp) / f"{t}.gguf", t, seed=2, n_ctx=n_ctx))
            for t in args.types.split(",")
        ]
        for name, path in models:
            with _load(path, n_ctx, args.gpu_layers) as model:
                for cells in contexts:
                    results.append(Rows(name, cells, compare_rows(model, cells, args.max_rows)))
            print(f"[{time.perf_counter() - t0:5.1f}s] {name}: compared", flush=True)
        print("\nverify rows against one-token decoding, max |d logit| (k = 1 is the one-token row itself):")
        print(exact_table(results))
        n = min(r.exact_to() for r in results)
        print(f"bit-exact up to {n} rows for every model and length checked" + (" (none)" if n == 1 else ""))
        timed = "-"
        if not args.no_cost:
            if args.gguf:
                timed, path = args.gguf[0].name, args.gguf[0]
            else:
                from random_gguf import PRESETS, write_random_gguf

                shape = PRESETS[preset]
                timed, path = shape.label, write_random_gguf(Path(tmp) / f"{preset}.gguf", shape, seed=1)
            with _load(path, n_ctx, args.gpu_layers) as model:
                for cells in contexts:
                    costs[cells] = cost_curve(model, cells, args.max_rows, args.reps)
            print("\n" + cost_table(timed, costs))
    print(f"\ndone in {time.perf_counter() - t0:.0f} s", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {
        "build": facts,
        "contexts": contexts,
        "rows": [asdict(r) | {"exact_to": r.exact_to()} for r in results],
        "exact_to": n,
        "cost_model": timed,
        "cost": {str(k): v for k, v in costs.items()},
    }
    (args.out / "verify-rows.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
