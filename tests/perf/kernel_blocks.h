// What tests/perf/kernel_rows.c and kernel_ab.c share: ggml's block layouts (as the CPU backend lays
// them out: Q6_K, the Q8_K activations, repacked Q4_K in groups of 8 columns), a clock, and random
// blocks whose fp16 scales and 16-value sums are sane, so every kernel computes real numbers.
#ifndef SPECCHAT_KERNEL_BLOCKS_H
#define SPECCHAT_KERNEL_BLOCKS_H
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#define QK_K 256
typedef uint16_t half;
typedef struct { uint8_t ql[QK_K/2]; uint8_t qh[QK_K/4]; int8_t scales[QK_K/16]; half d; } block_q6_K;
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K/16]; } block_q8_K;
typedef struct { half d[8]; half dmin[8]; uint8_t scales[96]; uint8_t qs[1024]; } block_q4_Kx8;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void fill(void * p, size_t n) { uint8_t * b = p; for (size_t i = 0; i < n; i++) b[i] = (uint8_t) rand(); }

// n random Q6_K superblocks with scales near 1.0
static void random_q6_K(block_q6_K * x, long n) {
  fill(x, sizeof(block_q6_K) * n);
  for (long i = 0; i < n; i++) x[i].d = 0x3c00 ^ (i % 7);
}
// n random repacked Q4_K blocks (8 columns each) with scales and mins near 1.0 and 0.5
static void random_q4_Kx8(block_q4_Kx8 * x, long n) {
  fill(x, sizeof(block_q4_Kx8) * n);
  for (long i = 0; i < n; i++) for (int j = 0; j < 8; j++) { x[i].d[j] = 0x3c00 ^ (j + i % 3); x[i].dmin[j] = 0x3800 ^ (j + i % 5); }
}
// n random Q8_K activation blocks, each with its scale and its true 16-value sums
static void random_q8_K(block_q8_K * y, long n) {
  fill(y, sizeof(block_q8_K) * n);
  for (long i = 0; i < n; i++) {
    y[i].d = 0.01f * (1 + i % 7);
    for (int j = 0; j < 16; j++) { int s = 0; for (int k = 0; k < 16; k++) s += y[i].qs[j * 16 + k]; y[i].bsums[j] = s; }
  }
}
#endif
