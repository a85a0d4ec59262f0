"""The installed llama.cpp's activation quantiser against ggml's reference one, byte for byte, the
flash-attention patch's vector expf against libm's, the several-rows repacked Q4_K kernel against the
one-row GEMV, the repacked Q6_K kernel against itself one row at a time and against vec_dot, and the
several-rows float and Q8_0 kernels against their one-row vec_dots, product by product.

The x86 K-quant patch (patches/llama.cpp/0001-*) vectorises quantize_row_q8_K (activations to Q8_K, the
other side of every k-quant dot product). The invariance probe cannot catch a quantiser that is wrong
the same way for one row and for a batch, so this holds it to the reference directly: the same bytes
(scale, quants and 16-value sums) on rows built to hit its corners (.5 ties after scaling, all-zero
blocks, the largest magnitude twice with opposite signs). Skipped where the build does not export both
(not a CPU build of ggml).
"""

from __future__ import annotations

import ctypes
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

PERF = Path(__file__).resolve().parent / "perf"
if str(PERF) not in sys.path:
    sys.path.insert(0, str(PERF))

import expf_exact  # noqa: E402  (tests/perf/expf_exact.py: a script folder, imported as test_replay does)

QK_K = 256
BLOCK = 4 + QK_K + 2 * (QK_K // 16)  # block_q8_K: float d, int8 qs[256], int16 bsums[16]


def _libraries(*cpu_symbols: str) -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """The installed libggml-base and libggml-cpu, skipping the test where they lack both quantisers,
    ggml_cpu_init or any of `cpu_symbols` (not a CPU build of ggml, or one without that kernel)."""
    import llama_cpp

    lib = Path(llama_cpp.__file__).parent / "lib"
    try:
        base = ctypes.CDLL(str(lib / "libggml-base.so"))
        cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"))
        wanted = ((cpu, "quantize_row_q8_K"), (base, "quantize_row_q8_K_ref"), (cpu, "ggml_cpu_init"))
        for dll, name in (*wanted, *((cpu, name) for name in cpu_symbols)):
            getattr(dll, name)
    except (OSError, AttributeError) as exc:
        pytest.skip(f"no CPU ggml with the kernels this test needs in {lib}: {exc}")
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


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 code")
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
def test_the_vector_expf_in_the_flash_attention_patch_is_libms_expf(isa: str):
    """The flash-attention patch's softmax exponentials (the AVX512 version on an AVX512 CPU, and the
    AVX2 one), compiled from the patch file itself, equal libm's expf on a sample of every float range
    (`python tests/perf/expf_exact.py --stride 1 [--isa avx2]` checks all 2^32)."""
    why = expf_exact.can_run(isa)
    if why:
        pytest.skip(f"cannot compile and run the {isa} expf here: {why}")
    ok, report = expf_exact.check(stride=4099, isa=isa)
    assert ok, report
    assert report.startswith("1047824 floats, 0 differ")


BLOCK_Q4_KX8 = 16 + 16 + 96 + 1024  # block_q4_Kx8: fp16 d[8], fp16 dmin[8], scales[96], qs[1024]


def _bytes(values: np.ndarray, width: int) -> np.ndarray:
    """Each row of values as `width` raw bytes (a field of a packed block)."""
    return np.frombuffer(np.ascontiguousarray(values).tobytes(), np.uint8).reshape(-1, width)


def _q4_kernels(cpu: ctypes.CDLL) -> tuple[object, object]:
    """The several-rows and the one-row repacked Q4_K kernels, typed for ctypes."""
    rows, one = cpu.ggml_gemv_q4_K_8x8_q8_K_rows, cpu.ggml_gemv_q4_K_8x8_q8_K
    ptr, i32 = ctypes.c_void_p, ctypes.c_int
    args = [i32, ptr, ctypes.c_size_t, ptr, ptr, i32, i32]  # n, s, bs, vx, vy, nr, nc
    for fn in (rows, one):
        fn.argtypes, fn.restype = args, None
    return rows, one


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 code")
@pytest.mark.parametrize("nrows", [2, 3, 4, 5, 8, 15, 16, 17])
def test_the_several_rows_q4_K_kernel_gives_every_row_the_one_row_result(nrows: int):
    """The x86 K-quant patch's kernel (with its prefetch of the next column pair) on 72 columns (four
    16-column pairs, three of them prefetched ahead, and one 8-column group left over) equals the
    one-row GEMV on every row, bit for bit; 2-3 rows take its 8-column loop, 17 rows a second block."""
    _, cpu = _libraries("ggml_gemv_q4_K_8x8_q8_K_rows", "ggml_gemv_q4_K_8x8_q8_K")
    rows_kernel, one_row = _q4_kernels(cpu)
    cpu.ggml_cpu_init()  # fills the fp16 table the kernels read their scales through
    rng = np.random.default_rng(nrows)
    n, ncols = 1536, 72
    nb = n // QK_K
    w = rng.integers(0, 256, (ncols // 8) * nb * BLOCK_Q4_KX8, dtype=np.uint8).reshape(-1, BLOCK_Q4_KX8)
    w[:, :32] = _bytes(rng.uniform(1e-3, 2e-2, (len(w), 16)).astype(np.float16), 32)  # d and dmin
    a = np.zeros((nrows * nb, BLOCK), dtype=np.uint8)
    qs = rng.integers(-128, 128, (nrows * nb, QK_K), dtype=np.int8)
    a[:, :4] = _bytes(rng.uniform(0.01, 0.1, nrows * nb).astype(np.float32), 4)  # d
    a[:, 4 : 4 + QK_K] = qs.view(np.uint8)
    a[:, 4 + QK_K :] = _bytes(qs.reshape(-1, 16, 16).sum(axis=2, dtype=np.int16), 32)  # bsums
    got = np.full((nrows, ncols), np.nan, dtype=np.float32)
    want = np.full((nrows, ncols), np.nan, dtype=np.float32)
    vx, vy = w.ctypes.data, a.ctypes.data
    rows_kernel(n, got.ctypes.data, ncols, vx, vy, nrows, ncols)
    for r in range(nrows):
        one_row(n, want[r].ctypes.data, ncols, vx, vy + r * nb * BLOCK, 1, ncols)
    assert np.isfinite(want).all() and np.abs(want).max() > 0  # real results, not two untouched buffers
    assert np.array_equal(got, want), f"rows differ: {sorted(set(np.nonzero(got != want)[0].tolist()))}"


BLOCK_Q6_K = 128 + 64 + 16 + 2  # block_q6_K: ql[128], qh[64], int8 scales[16], fp16 d


def _q6_K_blocks(rng: np.random.Generator, ncols: int, nb: int) -> np.ndarray:
    """Random Q6_K blocks (ncols x nb x BLOCK_Q6_K bytes): any 6-bit values and int8 scales, small d."""
    w = rng.integers(0, 256, (ncols, nb, BLOCK_Q6_K), dtype=np.uint8)
    w[:, :, 208:] = _bytes(rng.uniform(1e-3, 1e-2, (ncols, nb)).astype(np.float16), 2).reshape(ncols, nb, 2)
    return w


def _repack_q6_K_8x8(w: np.ndarray) -> np.ndarray:
    """llama.cpp's make_block_q6_Kx8 with 8-byte interleave, in numpy: per 8 columns and superblock,
    fp16 d[8], scales[16 x 8] (sub block major), then ql and qh taken 8 bytes from each column in turn."""
    ncols, nb, _ = w.shape
    g = w.reshape(ncols // 8, 8, nb, BLOCK_Q6_K).transpose(0, 2, 1, 3)  # group, superblock, column, byte
    ql = g[..., :128].reshape(*g.shape[:3], 16, 8).transpose(0, 1, 3, 2, 4)
    qh = g[..., 128:192].reshape(*g.shape[:3], 8, 8).transpose(0, 1, 3, 2, 4)
    scales = g[..., 192:208].transpose(0, 1, 3, 2)
    parts = (g[..., 208:], scales, ql, qh)
    return np.concatenate([p.reshape(ncols // 8, nb, -1) for p in parts], axis=2).reshape(-1)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 code")
@pytest.mark.parametrize("nrows", [1, 2, 3, 4, 5, 8, 15, 16, 17, 33])
def test_the_repacked_q6_K_kernel_gives_every_row_the_one_row_result(nrows: int):
    """With AVX512 VNNI, repacked Q6_K takes ggml_gemv_q6_K_8x8_q8_K_rows for every row count (an 8-column
    kernel up to 16 rows, a 16-column one past 16). On 72 columns (four 16-column pairs and one group
    left over), every row of a batch equals that row alone bit for bit, and the values are vec_dot's
    on the unrepacked blocks up to float rounding (so the layout is read as llama.cpp repacks it)."""
    _, cpu = _libraries("ggml_gemv_q6_K_8x8_q8_K_rows", "ggml_vec_dot_q6_K_q8_K")
    ptr, i32, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    rows_kernel, vec_dot = cpu.ggml_gemv_q6_K_8x8_q8_K_rows, cpu.ggml_vec_dot_q6_K_q8_K
    rows_kernel.argtypes, rows_kernel.restype = [i32, ptr, size, ptr, ptr, i32, i32], None
    vec_dot.argtypes, vec_dot.restype = [i32, ptr, size, ptr, size, ptr, size, i32], None
    cpu.quantize_row_q8_K.argtypes, cpu.quantize_row_q8_K.restype = [ptr, ptr, ctypes.c_int64], None
    cpu.ggml_cpu_init()
    rng = np.random.default_rng(100 + nrows)
    n, ncols = 1536, 72
    nb = n // QK_K
    w = _q6_K_blocks(rng, ncols, nb)
    packed = _repack_q6_K_8x8(w)
    x = ((rng.random((nrows, n), dtype=np.float32) - 0.5) * 4).astype(np.float32)
    a = np.zeros((nrows, nb * BLOCK), dtype=np.uint8)
    for r in range(nrows):
        cpu.quantize_row_q8_K(x[r].ctypes.data, a[r].ctypes.data, n)
    got = np.full((nrows, ncols), np.nan, dtype=np.float32)
    one = np.full((nrows, ncols), np.nan, dtype=np.float32)
    ref = np.full((nrows, ncols), np.nan, dtype=np.float32)
    rows_kernel(n, got.ctypes.data, ncols, packed.ctypes.data, a.ctypes.data, nrows, ncols)
    for r in range(nrows):
        rows_kernel(n, one[r].ctypes.data, ncols, packed.ctypes.data, a[r].ctypes.data, 1, ncols)
        for c in range(ncols):
            vec_dot(n, ref[r, c:].ctypes.data, 0, w[c].ctypes.data, 0, a[r].ctypes.data, 0, 1)
    assert np.isfinite(one).all() and np.abs(one).max() > 0  # real results, not untouched buffers
    assert np.array_equal(got, one), f"rows differ: {sorted(set(np.nonzero(got != one)[0].tolist()))}"
    gap = np.abs(one - ref).max() / np.abs(ref).max()
    assert gap <= 1e-5, f"not vec_dot's values: largest difference {gap:.2e} of the largest value"


def _tile_kernels(cpu: ctypes.CDLL, tile: str, one_row: str) -> tuple[Any, Any]:
    """(weight rows x activation rows kernel, one-row vec_dot), typed: the float verify-rows patch's
    and the Q8_0 one's take the same arguments."""
    i32, ptr, size = ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t
    block, one = getattr(cpu, tile), getattr(cpu, one_row)
    # n, s, bs, x, bx, nw, y, by, nr
    block.argtypes, block.restype = [i32, ptr, size, ptr, size, i32, ptr, size, i32], None
    one.argtypes = [i32, ptr, size, ptr, size, ptr, size, i32]  # n, s, bs, x, bx, y, by, nrc
    one.restype = None
    return block, one


def _half_bits(values: np.ndarray, name: str) -> np.ndarray:
    """float32 values as F16 or BF16 bit patterns (BF16: the top half of each float32)."""
    if name == "f16":
        return values.astype(np.float16).view(np.uint16)
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _assert_tile_is_one_row(tile: Any, one_row: Any, n: int, x: np.ndarray, y: np.ndarray) -> None:
    """`tile` (n, s, bs, x, bx, nw, y, by, nr: every weight row of `x` against every row of `y`)
    gives each product exactly what `one_row` (a one-row vec_dot) gives that pair, and writes
    nothing past its nw results per row. Rows of `x` and `y` are one array row each, any stride."""
    nw, nrows = len(x), len(y)
    bs = nw + 3  # each activation row's results nw + 3 floats apart
    got = np.full(nrows * bs, np.nan, dtype=np.float32)
    want = np.full((nrows, nw), np.nan, dtype=np.float32)
    tile(n, got.ctypes.data, bs, x.ctypes.data, x.strides[0], nw, y.ctypes.data, y.strides[0], nrows)
    for r in range(nrows):
        for w in range(nw):
            one_row(n, want[r, w:].ctypes.data, 0, x[w].ctypes.data, 0, y[r].ctypes.data, 0, 1)
    got = got.reshape(nrows, bs)
    assert np.isnan(got[:, nw:]).all(), "wrote past the tile"
    assert np.isfinite(want).all() and np.abs(want).max() > 0  # real results, not untouched buffers
    assert np.array_equal(got[:, :nw], want), f"products differ: {np.argwhere(got[:, :nw] != want).tolist()}"


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 code")
@pytest.mark.parametrize("name", ["f16", "bf16"])
@pytest.mark.parametrize("n", [1024, 1000, 8960])
@pytest.mark.parametrize(
    ("nw", "nrows"),
    [(1, 2), (3, 3), (4, 4), (4, 5), (6, 6), (5, 7), (4, 8), (9, 9), (3, 11), (4, 13), (2, 16), (7, 16)],
)
def test_the_several_rows_float_kernels_give_every_row_the_one_row_result(
    name: str, n: int, nw: int, nrows: int
):
    """The float verify-rows patch's kernels (tiles of weight rows x activation rows, every vector loaded
    once for a whole row or column of the tile) equal the one-row vec_dot on every product, bit for bit:
    full tiles and partial ones on both sides, rows split into tiles of 4 to 6 (5, 6, 11, 13, 16 rows);
    n = 1000 leaves a tail past the last full vector step, n = 8960 (an FFN's down projection) runs the
    steps in several chunks."""
    _, cpu = _libraries(f"ggml_vec_dot_{name}_block", f"ggml_vec_dot_{name}")
    block_kernel, one_row = _tile_kernels(cpu, f"ggml_vec_dot_{name}_block", f"ggml_vec_dot_{name}")
    cpu.ggml_cpu_init()  # the fp16 table the scalar tail reads through
    rng = np.random.default_rng(nrows * 7 + n + nw)
    stride = n + 24  # rows apart by more than n values, as strided weights and batches would be
    x = _half_bits(rng.standard_normal((nw, stride)) / np.sqrt(n), name)
    y = _half_bits(rng.standard_normal((nrows, stride)), name)
    _assert_tile_is_one_row(block_kernel, one_row, n, x, y)


BLOCK_Q8_0 = 2 + 32  # block_q8_0: fp16 d, int8 qs[32]


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 code")
@pytest.mark.parametrize("nrows", [1, 2, 3, 5, 7, 8, 9, 13, 16, 17, 33])
@pytest.mark.parametrize("nw", [1, 2, 5])
@pytest.mark.parametrize("n", [1024, 4864])
def test_the_several_rows_q8_0_kernel_gives_every_row_the_one_row_result(nrows: int, nw: int, n: int):
    """Q8_0 verify batches take ggml_vec_dot_q8_0_q8_0_rows (tiles of weight rows x activation rows,
    each weight block read once for several rows, rows split as evenly as the registers allow: 9 as
    5 + 4). Every product equals ggml_vec_dot_q8_0_q8_0 on that pair alone, bit for bit, with quants
    at ±127 and all-zero blocks among them, for full and partial tiles on both sides; n = 4864 (a
    0.5B model's FFN) runs past the prefetch distance in every row."""
    _, cpu = _libraries("ggml_vec_dot_q8_0_q8_0_rows", "ggml_vec_dot_q8_0_q8_0", "quantize_row_q8_0")
    rows_kernel, one_row = _tile_kernels(cpu, "ggml_vec_dot_q8_0_q8_0_rows", "ggml_vec_dot_q8_0_q8_0")
    cpu.quantize_row_q8_0.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    cpu.quantize_row_q8_0.restype = None
    cpu.ggml_cpu_init()
    rng = np.random.default_rng(nrows * 31 + n + nw)
    values = (rng.standard_normal((nw + nrows, n)) * rng.integers(1, 9, (nw + nrows, 1))).astype(np.float32)
    values[:, 5 * 32 : 6 * 32] = 0.0  # an all-zero block
    values[:, 7 * 32] = -1000.0  # a block whose largest magnitude quantises to -127 and one to +127
    values[:, 9 * 32 + 3] = 1000.0
    stride = n // 32 * BLOCK_Q8_0 + 16  # rows apart by more than a row, as strided weights and batches
    packed = np.zeros((nw + nrows, stride), dtype=np.uint8)
    for r in range(nw + nrows):
        cpu.quantize_row_q8_0(values[r].ctypes.data, packed[r].ctypes.data, n)
    w, y = np.ascontiguousarray(packed[:nw]), np.ascontiguousarray(packed[nw:])
    _assert_tile_is_one_row(rows_kernel, one_row, n, w, y)
