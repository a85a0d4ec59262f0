// The x86 K-quant patch's two repacked-Q6_K kernels side by side, compiled from the patch file itself (the
// 8-column one that one token and verify batches take, and the 16-column one that batches past 16
// rows take), on the same random blocks: ns per superblock and row for each, the ratio, and whether
// they give the same bytes (they must: a column's arithmetic is the same in both). Not a test; run it
// through tests/perf/q6k_kernels.py, which cuts the kernels out of the patch and builds this with
// -march=native (an x86 CPU with AVX512 VNNI). Arguments: columns W, rows R <= 64, rounds.
#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>
#define GGML_RESTRICT __restrict__
#include "kernel_blocks.h"
#include "q6k_kernels.inc"  // written by q6k_kernels.py from the patch

int main(int argc, char ** argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s W R ROUNDS\n", argv[0]); return 2; }
    const int n = 1536, nb = n / QK_K;
    const long W = atol(argv[1]);
    const int R = atoi(argv[2]), rounds = atoi(argv[3]);
    if (W % 16 || R < 1 || R > 64 || rounds < 1) { fprintf(stderr, "W a multiple of 16, 1 <= R <= 64\n"); return 2; }
    std::vector<block_q6_K> x((size_t) nb * W);
    random_q6_K(x.data(), (long) nb * W);
    block_q6_Kx8 * xr = (block_q6_Kx8 *) aligned_alloc(64, sizeof(block_q6_Kx8) * nb * W / 8);
    repack_q6_K_8x8(x.data(), xr, W, nb);
    block_q8_K * y = (block_q8_K *) aligned_alloc(64, sizeof(block_q8_K) * nb * R);
    random_q8_K(y, (long) nb * R);
    std::vector<float> o8((size_t) R * W), o16((size_t) R * W);
    std::vector<double> t8, t16;
    const int ngroups = (int) (W / 8);
    for (int it = 0; it < rounds; it++) {
        double t0 = now();  // the 8-column kernel over every group, as ggml_gemv_q6_K_8x8_q8_K_rows calls it
        for (int g = 0; g < ngroups; g++) {
            ggml_q6_Kx8_rows_8(nb, o8.data() + g * 8, W, xr + (long) g * nb, xr + (long) ngroups * nb, y, R);
        }
        t8.push_back((now() - t0) / W / R / nb * 1e9);
        t0 = now();  // the 16-column kernel over pairs of groups, the same way
        for (int g = 0; g < ngroups; g += 2) {
            const int left = ngroups - (g + 2), nnext = left < 2 ? (left > 0 ? left : 0) : 2;
            ggml_q6_Kx8_rows_16(nb, o16.data() + g * 8, W, xr + (long) g * nb, xr + (long) (g + 1) * nb,
                                xr + (long) (g + 2) * nb, nnext, y, R, 16);
        }
        t16.push_back((now() - t0) / W / R / nb * 1e9);
    }
    std::sort(t8.begin(), t8.end());
    std::sort(t16.begin(), t16.end());
    const double a = t8[rounds / 2], b = t16[rounds / 2];
    const bool same = memcmp(o8.data(), o16.data(), sizeof(float) * R * W) == 0;
    printf("W=%6ld (%4.0f MB) R=%2d: 8-column %5.2f  16-column %5.2f ns per superblock and row, 16/8 %.2f, %s\n", W,
           sizeof(block_q6_K) * nb * W / 1e6, R, a, b, b / a, same ? "same results" : "RESULTS DIFFER");
    return same ? 0 : 1;
}
