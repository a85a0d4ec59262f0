// Two builds of libggml-cpu in one process: their several-rows kernels (the x86 K-quant patch's
// repacked Q4_K one and its unrepacked Q6_K one) alternated call by call on the same random weights, and the median time of each,
// in nanoseconds per weight block and row, with whether the two builds' results are the same bytes.
// `q6r` compares two Q6_K kernels instead: A's several-rows vec_dot on the plain blocks against B's
// repacked kernel (ggml_gemv_q6_K_8x8_q8_K_rows, AVX512 VNNI builds) on the same blocks repacked; the two round
// differently, so it prints their largest difference relative to the largest value (A and B may be
// the same library).
// A kernel-level A/B for a change that only changes speed (a prefetch, say): comparing
// two processes on a small VM mixes the change with the machine's drift, alternating in one does not.
// Large W streams the weights from memory, as a model does (1536 x 65536 repacked Q4_K is 57 MB);
// small W keeps them in cache. Not a test. Build and run (A and B: two copies of libggml-cpu.so, e.g.
// the installed wheel's and a build of the queue with a change to a kernel):
//   L=$(.venv/bin/python -c 'import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))')/lib
//   gcc -O2 tests/perf/kernel_ab.c -o /tmp/kernel_ab -ldl -lm
//   LD_LIBRARY_PATH=$L /tmp/kernel_ab A/libggml-cpu.so B/libggml-cpu.so 1536 65536 16 15 [q6|q6r]
// (arguments: the two libraries, the row length n, the weight columns W, the activation rows R <= 64,
// the rounds, and q6 for the Q6_K kernel, q6r for the vec_dot one against the repacked one). Each library is dlopen'ed
// RTLD_LOCAL and initialised with its own ggml_cpu_init(), which fills the fp16 table the kernels read
// their scales through.
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "kernel_blocks.h"
// the repacked GEMVs' signature (Q4_K, Q6_K), and the several-rows Q6_K vec_dot's
typedef void (*gemv_rows_fn)(int, float *, size_t, const void *, const void *, int, int);
typedef void (*q6_rows_fn)(int, float *, size_t, const void *, const void *, size_t, int);
// largest |a - b| over the largest |a|
static double rel_gap(const float * a, const float * b, long n) {
  double gap = 0, top = 0;
  for (long i = 0; i < n; i++) { gap = fmax(gap, fabs((double) a[i] - b[i])); top = fmax(top, fabs((double) a[i])); }
  return gap / top;
}
static int cmp(const void * a, const void * b) { double x = *(const double *) a, y = *(const double *) b; return x < y ? -1 : x > y; }
int main(int argc, char ** argv) {
  if (argc < 7) { fprintf(stderr, "usage: %s LIB_A LIB_B N W R ROUNDS [q6|q6r]\n", argv[0]); return 2; }
  const int n = atoi(argv[3]), R = atoi(argv[5]), rounds = atoi(argv[6]);
  const int q6r = argc > 7 && !strcmp(argv[7], "q6r"), q6 = q6r || (argc > 7 && !strcmp(argv[7], "q6"));
  const long W = atol(argv[4]);
  if (n % QK_K || W % 16 || R < 1 || R > 64 || rounds < 1) { fprintf(stderr, "N a multiple of 256, W of 16, 1 <= R <= 64\n"); return 2; }
  gemv_rows_fn q4[2], q6x = NULL; q6_rows_fn q6k[2];
  for (int i = 0; i < 2; i++) {
    void * h = dlopen(argv[1 + i], RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    ((void (*)(void)) dlsym(h, "ggml_cpu_init"))();
    q4[i] = (gemv_rows_fn) dlsym(h, "ggml_gemv_q4_K_8x8_q8_K_rows");
    q6k[i] = (q6_rows_fn) dlsym(h, "ggml_vec_dot_q6_K_q8_K_rows");
    if (q6r && i == 1) q6x = (gemv_rows_fn) dlsym(h, "ggml_gemv_q6_K_8x8_q8_K_rows");
    const void * need = q6r && i == 1 ? (void *) q6x : q6 ? (void *) q6k[i] : (void *) q4[i];
    if (!need) { fprintf(stderr, "%s: no several-rows kernel\n", argv[1 + i]); return 1; }
  }
  const int nb = n / QK_K;
  const size_t sz = q6 ? sizeof(block_q6_K) * nb * W : sizeof(block_q4_Kx8) * nb * W / 8;
  void * x = aligned_alloc(64, (sz + 63) / 64 * 64);
  if (q6) { random_q6_K(x, (long) nb * W); } else { random_q4_Kx8(x, (long) nb * W / 8); }
  block_q6_Kx8 * xr = NULL;  // q6r: the same weights repacked, for B
  if (q6r) { xr = aligned_alloc(64, (sizeof(block_q6_Kx8) * nb * W / 8 + 63) / 64 * 64); repack_q6_K_8x8(x, xr, W, nb); }
  block_q8_K * y = aligned_alloc(64, sizeof(block_q8_K) * nb * R); random_q8_K(y, (long) nb * R);
  float * out[2] = { malloc(sizeof(float) * R * W), malloc(sizeof(float) * R * W) };
  double * t = malloc(sizeof(double) * 2 * rounds);
  for (int it = 0; it < rounds; it++) {
    for (int j = 0; j < 2; j++) {
      const int k = it % 2 ? 1 - j : j;  // A first in even rounds, B first in odd ones
      const double t0 = now();
      if (q6r && k == 1) { q6x(n, out[k], W, xr, y, R, W); }
      else if (q6) { for (long w = 0; w < W; w++) q6k[k](n, &out[k][w], W, (const block_q6_K *) x + w * nb, y, sizeof(block_q8_K) * nb, R); }
      else { q4[k](n, out[k], W, x, y, R, W); }
      t[k * rounds + it] = (now() - t0) / (q6 ? W : W / 8) / R / nb * 1e9;
    }
  }
  const int same = memcmp(out[0], out[1], sizeof(float) * R * W) == 0;
  const double gap = rel_gap(out[0], out[1], (long) R * W);
  qsort(t, rounds, sizeof(double), cmp); qsort(t + rounds, rounds, sizeof(double), cmp);
  const double a = t[rounds / 2], b = t[rounds + rounds / 2];
  char verdict[64];
  if (q6r) snprintf(verdict, sizeof verdict, "largest difference %.1e of the largest value", gap);
  printf("%s n=%d W=%ld (%.0f MB) R=%d: A %.2f  B %.2f ns per %s and row (medians of %d), B/A %.3f, %s\n",
         q6r ? "Q6_K, A vec_dot rows / B repacked" : q6 ? "Q6_K" : "Q4_K", n, W, sz / 1e6, R, a, b,
         q6 ? "superblock" : "8-column block", rounds, b / a, q6r ? verdict : same ? "same results" : "RESULTS DIFFER");
  return q6r ? gap > 1e-5 : !same;
}
