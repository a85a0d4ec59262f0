// What tests/perf/kernel_rows.c and kernel_ab.c share: ggml's block layouts (as the CPU backend lays
// them out: Q6_K, the Q8_K activations, repacked Q4_K and Q6_K in groups of 8 columns), a clock, random
// blocks whose fp16 scales and 16-value sums are sane, so every kernel computes real numbers, and the
// Q6_K repack (ggml's own is internal to the library).
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
typedef struct { half d[8]; int8_t scales[QK_K/16 * 8]; uint8_t ql[QK_K/2 * 8]; uint8_t qh[QK_K/4 * 8]; } block_q6_Kx8;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void fill(void * p, size_t n) { uint8_t * b = (uint8_t *) p; for (size_t i = 0; i < n; i++) b[i] = (uint8_t) rand(); }

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
// llama.cpp's q6_K_8x8 repack (make_block_q6_Kx8, 8-byte interleave): x holds W columns of nb
// superblocks each (column after column); out gets W/8 groups of nb blocks. Per group and superblock:
// the 8 columns' d, their scales sub block by sub block, then ql and qh 8 bytes from each column in turn.
static inline void repack_q6_K_8x8(const block_q6_K * x, block_q6_Kx8 * out, long W, int nb) {
  for (long g = 0; g < W / 8; g++) for (int b = 0; b < nb; b++) {
    block_q6_Kx8 * o = out + g * nb + b;
    for (int c = 0; c < 8; c++) {
      const block_q6_K * col = x + (g * 8 + c) * nb + b;
      o->d[c] = col->d;
      for (int j = 0; j < QK_K/16; j++) o->scales[j * 8 + c] = col->scales[j];
      for (int k = 0; k < QK_K/2 / 8; k++) for (int i = 0; i < 8; i++) o->ql[(k * 8 + c) * 8 + i] = col->ql[k * 8 + i];
      for (int k = 0; k < QK_K/4 / 8; k++) for (int i = 0; i < 8; i++) o->qh[(k * 8 + c) * 8 + i] = col->qh[k * 8 + i];
    }
  }
}
#endif
