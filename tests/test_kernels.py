"""The installed llama.cpp's activation quantiser against ggml's reference one, byte for byte, and patch
0011's vector expf against libm's.

Patch 0009 vectorises quantize_row_q8_K (activations to Q8_K, the other side of every k-quant dot
product) on x86. The invariance probe cannot catch a quantiser that is wrong the same way for one row
and for a batch, so this holds it to the reference directly: the same bytes (scale, quants and 16-value
sums) on rows built to hit its corners (.5 ties after scaling, all-zero blocks, the largest magnitude
twice with opposite signs). Skipped where the build does not export both (not a CPU build of ggml).
"""

from __future__ import annotations

import ctypes
import platform
import sys
from pathlib import Path

import numpy as np
import pytest

PERF = Path(__file__).resolve().parent / "perf"
if str(PERF) not in sys.path:
    sys.path.insert(0, str(PERF))

import expf_exact  # noqa: E402  (tests/perf/expf_exact.py: a script folder, imported as test_replay does)

QK_K = 256
BLOCK = 4 + QK_K + 2 * (QK_K // 16)  # block_q8_K: float d, int8 qs[256], int16 bsums[16]


def _libraries() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    import llama_cpp

    lib = Path(llama_cpp.__file__).parent / "lib"
    try:
        base = ctypes.CDLL(str(lib / "libggml-base.so"))
        cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"))
        wanted = ((cpu, "quantize_row_q8_K"), (base, "quantize_row_q8_K_ref"), (cpu, "ggml_cpu_init"))
        for dll, name in wanted:
            getattr(dll, name)
    except (OSError, AttributeError) as exc:
        pytest.skip(f"no CPU ggml with both quantisers in {lib}: {exc}")
    return base, cpu


def _rows(rng: np.random.Generator, kind: int, n: int) -> np.ndarray:
    x = (rng.random(n, dtype=np.float32) - 0.5) * float(rng.integers(1, 14))
    blocks = x.reshape(-1, QK_K)
    if kind == 1:  # halves: iscale * x lands on .5 often
        x[:] = rng.integers(-10, 11, n).astype(np.float32) * 0.5
    elif kind == 2:  # every third block all zeros (the reference leaves its sums untouched)
        blocks[::3] = 0.0
    elif kind == 3:  # the largest magnitude twice, negative first: the sign comes from the first
        blocks[:, 9] = -100.0
        blocks[:, 200] = 100.0
    elif kind == 4:  # positive first
        blocks[:, 3] = 7.25
        blocks[:, 250] = -7.25
    return x


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="patch 0009 is x86 code")
def test_the_activation_quantiser_writes_the_reference_bytes():
    base, cpu = _libraries()
    cpu.ggml_cpu_init()
    n = QK_K * 24
    rng = np.random.default_rng(9)
    fptr = ctypes.POINTER(ctypes.c_float)
    for trial in range(100):
        x = _rows(rng, trial % 5, n)
        ref = np.full(n // QK_K * BLOCK, 0x5A, dtype=np.uint8)
        got = ref.copy()
        src, count = x.ctypes.data_as(fptr), ctypes.c_int64(n)
        base.quantize_row_q8_K_ref(src, ref.ctypes.data_as(ctypes.c_void_p), count)
        cpu.quantize_row_q8_K(src, got.ctypes.data_as(ctypes.c_void_p), count)
        assert np.array_equal(got, ref), f"trial {trial}: first differing byte {int(np.argmax(got != ref))}"
        quants = ref.reshape(-1, BLOCK)[:, 4 : 4 + QK_K]
        assert (quants != 0x5A).any()  # the reference wrote its quants: not two untouched buffers compared


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_the_vector_expf_in_patch_0011_is_libms_expf(isa: str):
    """Patch 0011's softmax exponentials (the AVX512 version on an AVX512 CPU, and the AVX2 one),
    compiled from the patch file itself, equal libm's expf on a sample of every float range
    (`python tests/perf/expf_exact.py --stride 1 [--isa avx2]` checks all 2^32)."""
    why = expf_exact.can_run(isa)
    if why:
        pytest.skip(f"cannot compile and run the {isa} expf here: {why}")
    ok, report = expf_exact.check(stride=4099, isa=isa)
    assert ok, report
    assert report.startswith("1047824 floats, 0 differ")
