"""The x86 K-quant patch's two repacked-Q6_K kernels timed side by side, compiled from the patch file.

Why: ggml_gemv_q6_K_8x8_q8_K_rows picks its kernel by row count (an 8-column one reading the weights
in one stream, a 16-column one that regroups the values once for up to 16 rows), and which is faster
depends on whether the weights come from memory (one token, a verify batch: every weight read once)
or stay in cache (a prompt batch's 16-row passes). The kernels are static functions of the library,
so this cuts them out of the patch, builds tests/perf/q6k_kernels.cpp around them with -march=native
and times both on the same random blocks, per row count, streamed and in cache. They must give the
same bytes (a column's arithmetic is the same in both); a difference fails the run.

Not a test (pytest does not collect it); needs g++ and an x86 CPU with AVX512 VNNI.
Usage: python tests/perf/q6k_kernels.py [--rows 1,2,4,8,16,32] [--columns 64,65536] [--rounds 9]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUEUE = HERE.parents[1] / "patches" / "llama.cpp"
START = (
    "#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)"
)
#: the 8-column kernel, defined in the block that holds both kernels and their helper
KERNEL = "ggml_q6_Kx8_rows_8"
PATCH = next((p for p in sorted(QUEUE.glob("*.patch")) if KERNEL in p.read_text()), QUEUE / "missing.patch")


def kernels_source(patch: Path = PATCH) -> str:
    """The patch's added lines from the first AVX512 VNNI block that holds KERNEL to that block's
    #endif: the two kernels and their helper, as the patched repack.cpp holds them."""
    out: list[str] = []
    for line in patch.read_text().splitlines():
        if not line.startswith("+") or line.startswith("+++"):
            continue
        text = line[1:]
        if not out and text != START:
            continue
        out.append(text)
        if text == "#endif":
            block = "\n".join(out) + "\n"
            if KERNEL in block:
                return block
            out = []
    raise SystemExit(f"{patch.name}: no AVX512 VNNI block with {KERNEL} found")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,2,4,8,16,32")
    ap.add_argument("--columns", default="64,65536", help="64: in cache; 65536: 82 MB, streamed")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "q6k_kernels.inc").write_text(kernels_source())
        exe = Path(tmp) / "q6k_kernels"
        subprocess.run(["g++", "-O3", "-march=native", f"-I{HERE}", f"-I{tmp}", str(HERE / "q6k_kernels.cpp"),
                        "-o", str(exe)], check=True)  # fmt: skip
        failed = False
        for w in args.columns.split(","):
            for r in args.rows.split(","):
                out = subprocess.run([str(exe), w, r, str(args.rounds)], capture_output=True, text=True)
                sys.stdout.write(out.stdout or out.stderr)
                failed |= out.returncode != 0
        if failed:
            raise SystemExit("the two kernels gave different results (or could not run)")


if __name__ == "__main__":
    main()
