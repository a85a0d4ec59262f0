"""How the target's CPU load mode decides exactness and verify cost: one line per mode, measured.

llama.cpp's CPU backend picks its matmul kernel by batch size, and only rows computed by the same
kernel as one-token decoding are bit-identical to it. This script loads the target once per mode,
each in its own process (the kernel switches are read once per process), and prints the largest
bit-exact batch, the largest batched-vs-one-token logit difference (calibration.batch_noise), the
prefill time of 512 tokens and the verify curve V(n)/V(1):

  repack    repacked weights (what specchat loads): their GEMM from 4 rows up
  norepack  plain weights: vec_dot below 8 rows, the tiled K-quant kernel from 8
  notiled   plain weights, GGML_CPU_TILED_MM=0: vec_dot at every size
  force     plain weights, GGML_CPU_TILED_MM_FORCE=1: the tiled kernel at every size, one row too

Usage: python tests/perf/kernel_modes.py TARGET.gguf [MODE ...]
Not a test: run it alone on an idle machine (about a minute per mode for a 1.5B model on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

MODES = {
    "repack": {},
    "norepack": {},
    "notiled": {"GGML_CPU_TILED_MM": "0"},
    "force": {"GGML_CPU_TILED_MM_FORCE": "1"},
}
SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16, 17, 24, 32, 33)


def measure(target: Path, mode: str) -> dict[str, object]:
    """Run in the child process: load, probe, time."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from specchat.decoding.calibration import batch_noise, exact_batch, time_verify
    from specchat.llama.engine import GGML_TYPE_BF16, LlamaModel, LoadOptions

    with LlamaModel(target, LoadOptions(n_ctx=4096, type_v=GGML_TYPE_BF16, repack=mode == "repack")) as m:
        probe = [(i * 7919) % max(1, m.n_vocab - 16) + 8 for i in range(512)]
        prefill = []
        for _ in range(2):
            t = time.perf_counter()
            m.decode(probe, [])
            prefill.append(time.perf_counter() - t)
            m.truncate(0)
        exact = exact_batch(m, max(SIZES))
        m.truncate(0)
        noise = batch_noise(m, sizes=(4, 16, 32))
        m.decode(probe[:200], [])
        curve, spread = time_verify(m, max(SIZES), reps=3, sizes=SIZES)
    return {
        "mode": mode,
        "exact_rows": exact,
        "noise": round(noise, 4),
        "prefill_512_s": round(min(prefill), 2),
        "v1_ms": round(curve[0] * 1000, 1),
        "spread": round(spread, 3),
        "curve": {n: round(curve[n - 1] / curve[0], 2) for n in SIZES[1:]},
    }


def main() -> None:
    if len(sys.argv) >= 4 and sys.argv[1] == "--child":
        print(json.dumps(measure(Path(sys.argv[2]), sys.argv[3])))
        return
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    target = sys.argv[1]
    modes = sys.argv[2:] or list(MODES)
    for mode in modes:
        env = {**os.environ, **MODES[mode]}
        out = subprocess.run(
            [sys.executable, __file__, "--child", target, mode], env=env, capture_output=True, text=True
        )
        if out.returncode != 0:
            raise SystemExit(f"{mode}: failed\n{out.stderr[-2000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        curve = " ".join(f"V({n}) {x:.2f}" for n, x in r["curve"].items())
        print(
            f"{mode:9s} exact to {r['exact_rows']:2d} rows, noise {r['noise']:.3f}, prefill 512 "
            f"{r['prefill_512_s']:.2f} s, V(1) {r['v1_ms']:.1f} ms (spread {r['spread']:.0%}); {curve}",
            flush=True,
        )


if __name__ == "__main__":
    main()
