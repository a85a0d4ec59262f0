"""The ARM repacked kernels: every row of a GEMM (4 rows at a time, activations quantised 4 rows
interleaved) equals the GEMV of that row alone (activations quantised one row), bit for bit.

llama.cpp sends each group of 4 rows of a batch to the GEMM and every row left over, and one-token
decoding, to the GEMV; the ARM patch in patches/llama.cpp makes the two round alike. The invariance
probe sees this through a whole model; these hold the kernels to it directly, on random blocks in the
repacked layouts (only the scales are chosen, so every value is finite), for the i8mm pairs llama.cpp
picks on an i8mm CPU (8x8 K-quants, 4x8 Q8_0 and Q4_0) and the dotprod pairs it picks without i8mm.

Run on aarch64 (`make test-aarch64` runs them under qemu-aarch64 on the cross-built libraries);
skipped elsewhere.
"""

from __future__ import annotations

import ctypes
import platform
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("aarch64", "arm64"), reason="ARM kernels")

QK_K = 256
Q8_K = 4 + QK_K + 2 * (QK_K // 16)  # block_q8_K: float d, int8 qs[256], int16 bsums[16]
Q8_KX4 = 4 * Q8_K  # block_q8_Kx4: float d[4], int8 qs[1024], int16 bsums[64]
Q8_0 = 2 + 32  # block_q8_0: fp16 d, int8 qs[32]
Q8_0X4 = 4 * Q8_0  # block_q8_0x4: fp16 d[4], int8 qs[128]


def _cpu() -> ctypes.CDLL:
    import llama_cpp

    lib = Path(llama_cpp.__file__).parent / "lib" / "libggml-cpu.so"
    try:
        cpu = ctypes.CDLL(str(lib))
    except OSError as exc:
        pytest.skip(f"no CPU ggml in {lib.parent}: {exc}")
    cpu.ggml_cpu_init()  # fills the fp16 table some kernels read their scales through
    return cpu


def _fp16_bytes(rng: np.random.Generator, count: int, low: float, high: float) -> np.ndarray:
    return np.frombuffer(rng.uniform(low, high, count).astype(np.float16).tobytes(), np.uint8)


def _q4_K(rng: np.random.Generator, groups: int, cols: int) -> np.ndarray:
    """block_q4_Kx8 / x4: fp16 d[cols], fp16 dmin[cols], 6-bit scales and mins, nibbles."""
    size = 4 * cols + 12 * cols + 128 * cols
    w = rng.integers(0, 256, (groups, size), dtype=np.uint8)
    w[:, : 2 * cols] = _fp16_bytes(rng, groups * cols, 1e-3, 2e-2).reshape(groups, -1)
    w[:, 2 * cols : 4 * cols] = _fp16_bytes(rng, groups * cols, 1e-3, 2e-2).reshape(groups, -1)
    return w


def _q5_K(rng: np.random.Generator, groups: int, cols: int) -> np.ndarray:
    """block_q5_Kx8 / x4: as Q4_K, with 32 bytes of high bits per column before the nibbles."""
    size = 4 * cols + 12 * cols + 32 * cols + 128 * cols
    w = rng.integers(0, 256, (groups, size), dtype=np.uint8)
    w[:, : 2 * cols] = _fp16_bytes(rng, groups * cols, 1e-3, 2e-2).reshape(groups, -1)
    w[:, 2 * cols : 4 * cols] = _fp16_bytes(rng, groups * cols, 1e-3, 2e-2).reshape(groups, -1)
    return w


def _q6_K(rng: np.random.Generator, groups: int, cols: int) -> np.ndarray:
    """block_q6_Kx8 / x4: fp16 d[cols], int8 scales[16 x cols], then the 6-bit quants."""
    size = 2 * cols + 16 * cols + 192 * cols
    w = rng.integers(0, 256, (groups, size), dtype=np.uint8)
    w[:, : 2 * cols] = _fp16_bytes(rng, groups * cols, 1e-3, 1e-2).reshape(groups, -1)
    scales = rng.integers(-40, 40, (groups, 16 * cols)).astype(np.int8)
    w[:, 2 * cols : 18 * cols] = scales.view(np.uint8)
    return w


def _q8_0(rng: np.random.Generator, groups: int, cols: int) -> np.ndarray:
    """block_q8_0xN: fp16 d[cols], int8 qs[32 x cols]."""
    w = rng.integers(0, 256, (groups, 2 * cols + 32 * cols), dtype=np.uint8)
    w[:, : 2 * cols] = _fp16_bytes(rng, groups * cols, 1e-3, 2e-2).reshape(groups, -1)
    return w


def _q4_0(rng: np.random.Generator, groups: int, cols: int) -> np.ndarray:
    """block_q4_0xN: fp16 d[cols], nibbles[16 x cols]."""
    w = rng.integers(0, 256, (groups, 2 * cols + 16 * cols), dtype=np.uint8)
    w[:, : 2 * cols] = _fp16_bytes(rng, groups * cols, 1e-3, 2e-2).reshape(groups, -1)
    return w


Blocks = Callable[[np.random.Generator, int, int], np.ndarray]
#: name -> (weight blocks, values per block, interleaved columns, activation quantiser 4-rows, 1-row,
#: one-row activation block bytes, four-row activation block bytes)
KERNELS: dict[str, tuple[Blocks, int, int, str, str, int, int]] = {
    "q4_K_8x8": (_q4_K, QK_K, 8, "ggml_quantize_mat_q8_K_4x8", "quantize_row_q8_K", Q8_K, Q8_KX4),
    "q5_K_8x8": (_q5_K, QK_K, 8, "ggml_quantize_mat_q8_K_4x8", "quantize_row_q8_K", Q8_K, Q8_KX4),
    "q6_K_8x8": (_q6_K, QK_K, 8, "ggml_quantize_mat_q8_K_4x8", "quantize_row_q8_K", Q8_K, Q8_KX4),
    "q4_K_8x4": (_q4_K, QK_K, 8, "ggml_quantize_mat_q8_K_4x4", "quantize_row_q8_K", Q8_K, Q8_KX4),
    "q5_K_8x4": (_q5_K, QK_K, 8, "ggml_quantize_mat_q8_K_4x4", "quantize_row_q8_K", Q8_K, Q8_KX4),
    "q6_K_8x4": (_q6_K, QK_K, 8, "ggml_quantize_mat_q8_K_4x4", "quantize_row_q8_K", Q8_K, Q8_KX4),
    "q8_0_4x8": (_q8_0, 32, 4, "ggml_quantize_mat_q8_0_4x8", "quantize_row_q8_0", Q8_0, Q8_0X4),
    "q8_0_4x4": (_q8_0, 32, 4, "ggml_quantize_mat_q8_0_4x4", "quantize_row_q8_0", Q8_0, Q8_0X4),
    "q4_0_4x8": (_q4_0, 32, 4, "ggml_quantize_mat_q8_0_4x8", "quantize_row_q8_0", Q8_0, Q8_0X4),
    "q4_0_4x4": (_q4_0, 32, 4, "ggml_quantize_mat_q8_0_4x4", "quantize_row_q8_0", Q8_0, Q8_0X4),
    "q4_0_8x8": (_q4_0, 32, 8, "ggml_quantize_mat_q8_0_4x8", "quantize_row_q8_0", Q8_0, Q8_0X4),
}


#: pairs whose GEMM is written for i8mm (without it, llama.cpp picks another layout and the GEMM here
#: is the C fallback, never run against this GEMV)
I8MM = {"q4_K_8x8", "q5_K_8x8", "q6_K_8x8", "q8_0_4x8", "q4_0_4x8", "q4_0_8x8"}


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("nrows", [4, 7, 8])
def test_every_gemm_row_equals_the_one_row_gemv(kernel: str, nrows: int) -> None:
    """forward_mul_mat's split, by hand: rows in groups of 4 through the GEMM, the rest through the GEMV,
    against every row through the GEMV alone (one-token decoding)."""
    cpu = _cpu()
    if kernel in I8MM and not cpu.ggml_cpu_has_matmul_int8():
        pytest.skip(f"{kernel} is an i8mm layout; this build has no i8mm")
    make, block, cols, quant4, quant1, one_bytes, four_bytes = KERNELS[kernel]
    suffix = "q8_K" if block == QK_K else "q8_0"
    names = (f"ggml_gemm_{kernel}_{suffix}", f"ggml_gemv_{kernel}_{suffix}", quant4, quant1)
    try:
        gemm, gemv, q4, q1 = (getattr(cpu, name) for name in names)
    except AttributeError as exc:
        pytest.skip(f"this ggml has no {exc}")
    ptr, i32 = ctypes.c_void_p, ctypes.c_int
    for fn in (gemm, gemv):
        fn.argtypes, fn.restype = [i32, ptr, ctypes.c_size_t, ptr, ptr, i32, i32], None
    for fn in (q4, q1):
        fn.argtypes, fn.restype = [ptr, ptr, ctypes.c_int64], None
    rng = np.random.default_rng(sum(map(ord, kernel)) + nrows)
    n, ncols = 6 * QK_K, 4 * 8
    nb = n // block
    w = make(rng, (ncols // cols) * nb, cols)
    x = ((rng.random((nrows, n), dtype=np.float32) - 0.5) * 4).astype(np.float32)
    x[:, ::7] *= 8  # a wider spread inside each block
    full = nrows - nrows % 4
    packed = np.zeros((max(full // 4, 1), nb * four_bytes), dtype=np.uint8)
    for g in range(full // 4):
        q4(x[4 * g : 4 * g + 4].ctypes.data, packed[g].ctypes.data, n)
    single = np.zeros((nrows, nb * one_bytes), dtype=np.uint8)
    for r in range(nrows):
        q1(x[r].ctypes.data, single[r].ctypes.data, n)
    batch = np.full((nrows, ncols), np.nan, dtype=np.float32)
    alone = np.full((nrows, ncols), np.nan, dtype=np.float32)
    if full:
        gemm(n, batch.ctypes.data, ncols, w.ctypes.data, packed.ctypes.data, full, ncols)
    for r in range(full, nrows):
        gemv(n, batch[r].ctypes.data, ncols, w.ctypes.data, single[r].ctypes.data, 1, ncols)
    for r in range(nrows):
        gemv(n, alone[r].ctypes.data, ncols, w.ctypes.data, single[r].ctypes.data, 1, ncols)
    assert np.isfinite(alone).all() and np.abs(alone).max() > 0  # real results, not untouched buffers
    differ = sorted(set(np.nonzero(batch != alone)[0].tolist()))
    gap = float(np.abs(batch - alone).max())
    assert not differ, f"rows {differ} of the batch differ from one row (max |d| {gap:.3g})"
