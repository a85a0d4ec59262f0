"""Where a verify batch's time goes: milliseconds per kernel for batches of 1, 2, 4, 8 and 16 rows.

Each size runs in its own process: the target is loaded (repacked weights, all rows' logits, as
specchat verifies), 200 tokens are decoded, then batches of N rows are decoded and rolled back over
and over while `perf record` samples the process from outside. perf's shares of the samples, times
the measured milliseconds per batch, give each kernel's milliseconds; kernels are grouped by what
they compute (the symbols are llama.cpp's CPU backend's, patched or stock).

Usage: python tests/perf/verify_breakdown.py TARGET.gguf [--sizes 1,2,4,8,16] [--seconds 8]
       [--cells 200] [--v-type bf16|f16]
       [--env NAME=VALUE ...]    (GGML_CPU_MULTIROW=0: the x86 K-quant patch's several-rows kernels off)
--cells: KV cells filled before the batches (a long conversation: attention's share grows with it);
--v-type: the V cache's type (f16 is what `specchat run` and `serve` load on a verified build; the
earlier tables used bf16, the default here).
Needs `perf` (Debian: linux-perf). Not a test: run it alone on an idle machine (~1 min a size).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: kernel groups, first match wins (regular expressions over perf's symbol names)
GROUPS: tuple[tuple[str, str], ...] = (
    ("Q4_K matmul", r"q4_K"),
    ("Q6_K matmul", r"q6_K|tiled_"),
    ("attention", r"flash_attn|softmax|libm\S* \S*expf"),  # expf: its softmax (nothing else calls it)
    ("activations to Q8_K", r"quantize_row_q8_K|quantize_mat"),
    ("thread waits", r"libgomp|ggml_barrier|sched_yield"),
    ("norms, rope, glu, adds", r"rms_norm|rope|swiglu|glu|add|mul_f32|get_rows|cpy|scale"),
    # a wheel's libggml-cpu keeps no names for its static functions: the flash-attention patch's
    # grouped attention kernel and, on AVX512 VNNI builds, the repacked Q6_K kernels (the static
    # helpers of ggml_gemv_q6_K_8x8_q8_K_rows) are the bulk of these; a build with symbols shows them
    ("unnamed ggml-cpu", r"libggml-cpu\S* 0x[0-9a-f]+[\s-]*$"),  # perf may pad the line with "-  -"
)


def child(target: str, n: int, seconds: float, cells: int = 200, v_type: str = "bf16") -> None:
    """Load, fill `cells` cells, say 'ready', then time batches of n rows for `seconds`."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from specchat.llama.engine import GGML_TYPE_BF16, LlamaModel, LoadOptions

    type_v = GGML_TYPE_BF16 if v_type == "bf16" else None
    n_ctx = max(4096, cells + 256)
    with LlamaModel(Path(target), LoadOptions(n_ctx=n_ctx, type_v=type_v, repack=True)) as m:
        probe = [(i * 7919) % (m.n_vocab - 16) + 8 for i in range(cells + 64)]
        m.decode(probe[:cells], [])
        start = len(m.tokens)
        rows = probe[cells : cells + n]
        for _ in range(3):  # warm-up: the first batch of a size allocates
            m.decode(rows, list(range(n)))
            m.truncate(start)
        print("ready", flush=True)
        times: list[float] = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t = time.perf_counter()
            m.decode(rows, list(range(n)))
            times.append(time.perf_counter() - t)
            m.truncate(start)
        times.sort()
        print(f"ms {1000 * times[len(times) // 2]:.2f}", flush=True)


def shares(data: Path) -> dict[str, float]:
    """perf report's per-symbol shares, summed into GROUPS (the rest under 'other')."""
    out = subprocess.run(
        ["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", "dso,symbol"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    total: dict[str, float] = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[.\]\s+(.*)", line)
        if not m:
            continue
        pct, dso, sym = float(m.group(1)), m.group(2), m.group(3)
        name = next((g for g, rx in GROUPS if re.search(rx, f"{dso} {sym}")), "other")
        total[name] = total.get(name, 0.0) + pct
    return total


def measure(
    target: str, n: int, seconds: float, env: dict[str, str], cells: int = 200, v_type: str = "bf16"
) -> tuple[float, dict[str, float]]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", target, str(n), str(seconds), str(cells), v_type],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit(f"N={n}: the child did not start")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "perf.data"
        sleep = str(max(1.0, seconds - 1.0))
        argv = ["perf", "record", "-q", "-F", "499", "-p", str(proc.pid), "-o", str(data)]
        argv += ["--", "sleep", sleep]
        subprocess.run(argv, capture_output=True, check=True)
        ms = float(proc.stdout.readline().split()[1])
        proc.wait()
        return ms, shares(data)


def main() -> None:
    if len(sys.argv) == 7 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target")
    ap.add_argument("--sizes", default="1,2,4,8,16")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--cells", type=int, default=200, help="KV cells filled before the batches")
    ap.add_argument("--v-type", choices=("bf16", "f16"), default="bf16", help="the V cache's type")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the measured process")
    a = ap.parse_args()
    env = dict(e.split("=", 1) for e in a.env)
    sizes = (int(s) for s in a.sizes.split(","))
    rows = [(n, *measure(a.target, n, a.seconds, env, a.cells, a.v_type)) for n in sizes]
    names = [g for g, _ in GROUPS] + ["other"]
    v1 = rows[0][1] if rows[0][0] == 1 else None
    print(f"{'rows':>4} {'ms':>7} {'V(n)':>5}  " + "  ".join(f"{g:>12.12}" for g in names))
    for n, ms, pct in rows:
        v = f"{ms / v1:5.2f}" if v1 else "    -"
        cells = "  ".join(f"{ms * pct.get(g, 0.0) / 100:12.1f}" for g in names)
        print(f"{n:>4} {ms:7.1f} {v}  {cells}")
    print("(milliseconds per batch in each group: perf's share of the samples times the batch's median time)")


if __name__ == "__main__":
    main()
