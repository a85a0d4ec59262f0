"""The flash-attention patch's vector expf against this machine's libm expf, bit for bit.

The flash-attention patch (patches/llama.cpp/0003-*) computes the softmax's exponentials 16 at a time
with a copy of glibc's expf in AVX512 (and checks itself against libm once per process, falling back to
libm on any difference). This takes the code out of the patch file itself (the lines from its table to
the end of `ggml_fa_expf16`), compiles it with a loop over float bit patterns and compares every result
with libm's `expf`: `--stride 1` is all 2^32 floats (~35 s on one core), the default a sample for a
test.

    python tests/perf/expf_exact.py [--stride N] [--isa native|avx2] [--patch PATH]

`--isa avx2` compiles the AVX2 + FMA version (x86-64-v3) instead of the machine's own (the AVX512 one
on an AVX512 CPU). Needs g++ and a CPU with what the chosen version uses; says so and exits 2 otherwise.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PATCH = Path(__file__).resolve().parents[2] / "patches" / "llama.cpp"
START = "static const uint64_t ggml_fa_exp2f_tab[32]"
END = "// Whether ggml_fa_expf16 gives this process's libm expf"

MAIN = r"""
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char ** argv) {
    const uint64_t stride = strtoull(argv[1], NULL, 10);
    uint64_t bad = 0, n = 0;
    alignas(64) float xs[16];
    alignas(64) float ys[16];
    for (uint64_t base = 0; base < (1ull << 32); base += 16*stride) {
        for (int i = 0; i < 16; ++i) {
            const uint32_t b = (uint32_t) (base + (uint64_t) i*stride);
            memcpy(&xs[i], &b, 4);
            ys[i] = xs[i];
        }
        ggml_fa_expf16(ys);
        for (int i = 0; i < 16; ++i) {
            const float e = expf(xs[i]);
            if (memcmp(&e, &ys[i], 4) != 0 && !(isnan(e) && isnan(ys[i]))) {
                if (bad < 5) printf("x=%a: %a, libm %a\n", xs[i], ys[i], e);
                ++bad;
            }
            ++n;
        }
    }
    printf("%llu floats, %llu differ from libm's expf\n", (unsigned long long) n, (unsigned long long) bad);
    return bad != 0;
}
"""


def patch_code(patch: Path) -> str:
    """The vector expf's C++ as the patch adds it (its '+' lines between START and END)."""
    lines = patch.read_text().splitlines()
    text = "\n".join(line[1:] for line in lines if line.startswith("+") and not line.startswith("+++"))
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{patch.name}: no vector expf between {START!r} and {END!r}")
    return text[start:end]


def queue_patch_with(marker: str) -> Path:
    """The queue's patch that adds `marker` (found by content, so a renumbered queue needs no edit)."""
    for patch in sorted(PATCH.glob("*.patch")):
        if marker in patch.read_text():
            return patch
    raise SystemExit(f"no patch in {PATCH} adds {marker!r}")


ISA_FLAGS = {"native": ["-march=native"], "avx2": ["-march=x86-64-v3"]}
ISA_CPU = {"native": ("avx512f", "avx512dq"), "avx2": ("avx2", "fma")}


def can_run(isa: str = "native") -> str | None:
    """Why the check cannot run here, or None."""
    if shutil.which("g++") is None:
        return "no g++"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "no /proc/cpuinfo"
    missing = [f for f in ISA_CPU[isa] if not re.search(rf"\b{f}\b", flags)]
    if missing:
        return f"the CPU lacks {', '.join(missing)}"
    return None


def check(stride: int, patch: Path | None = None, isa: str = "native") -> tuple[bool, str]:
    """Compile the patch's expf with a comparison loop and run it; (all equal, its report line)."""
    patch = patch or queue_patch_with(START)
    source = "#include <immintrin.h>\n#include <math.h>\n#include <stdint.h>\n#include <string.h>\n"
    source += patch_code(patch) + MAIN
    with tempfile.TemporaryDirectory(prefix="specchat-expf-") as tmp:
        src, exe = Path(tmp) / "expf.cpp", Path(tmp) / "expf"
        src.write_text(source)
        subprocess.run(["g++", "-O2", *ISA_FLAGS[isa], "-o", str(exe), str(src), "-lm"], check=True)
        done = subprocess.run([str(exe), str(stride)], capture_output=True, text=True, check=False)
    return done.returncode == 0, done.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stride", type=int, default=257, help="check every Nth float bit pattern (1: all)")
    ap.add_argument("--isa", choices=sorted(ISA_FLAGS), default="native", help="which version to compile")
    ap.add_argument("--patch", type=Path, default=None)
    args = ap.parse_args()
    why = can_run(args.isa)
    if why:
        print(f"cannot check here: {why}")
        sys.exit(2)
    ok, report = check(args.stride, args.patch, args.isa)
    print(report)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
