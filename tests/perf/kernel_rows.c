// The x86 K-quant patch's several-rows kernels (repacked Q4_K; unrepacked Q6_K) against the one-row kernels,
// on random data that stays in cache: nanoseconds per weight block and row, and whether every row's
// result equals the one-row kernel's bit for bit ("same"). Not a test; a kernel-level check to run after
// changing either patch. Build against the patched libggml-cpu (the venv's, or a build of the queue):
//   L=$(.venv/bin/python -c 'import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))')/lib
//   gcc -O2 -march=native tests/perf/kernel_rows.c -o /tmp/kernel_rows -L$L -lggml-cpu -lggml-base -lm -Wl,-rpath,$L
//   /tmp/kernel_rows
// W is 72 columns: four 16-column pairs and one 8-column group left over (both paths of the Q4_K kernel). Last,
// the vectorised activation quantiser (quantize_row_q8_K) against the reference one (libggml-base's
// quantize_row_q8_K_ref), on random rows with ties and zero blocks: "same" where every byte agrees.
// ggml_cpu_init() comes first: it fills the fp16 table the kernels read their scales through (without it
// every scale reads as 0, every result is 0, and "same" says nothing).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "kernel_blocks.h"
void ggml_vec_dot_q6_K_q8_K(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void ggml_vec_dot_q6_K_q8_K_rows(int n, float * s, size_t bs, const void * vx, const void * vy, size_t by, int nrc);
void ggml_gemv_q4_K_8x8_q8_K(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
void ggml_gemv_q4_K_8x8_q8_K_rows(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
void quantize_row_q8_K(const float * x, void * y, int64_t k);
void quantize_row_q8_K_ref(const float * x, block_q8_K * y, int64_t k);
void ggml_cpu_init(void);
int main(void){
  ggml_cpu_init();
  const int n=1536, nb=n/QK_K, W=72; // 72 weight rows (Q6_K) / 72 columns (Q4_K): ~90 KB
  block_q6_K *x6=aligned_alloc(64,sizeof(block_q6_K)*nb*W); random_q6_K(x6,nb*W);
  block_q4_Kx8 *x4=aligned_alloc(64,sizeof(block_q4_Kx8)*nb*W/8); random_q4_Kx8(x4,nb*W/8);
  block_q8_K *y=aligned_alloc(64,sizeof(block_q8_K)*nb*16); random_q8_K(y,nb*16);
  float out[16*72]; float ref[16*72];
  int sizes[]={1,2,4,8,16};
  for(int si=0;si<5;si++){int R=sizes[si];
    // Q6_K
    int reps=2000; double t=now();
    for(int it=0;it<reps;it++) for(int w=0;w<W;w++) for(int r=0;r<R;r++) ggml_vec_dot_q6_K_q8_K(n,&ref[r*W+w],0,x6+w*nb,0,y+r*nb,0,1);
    double t1=(now()-t)/reps/W/R/nb*1e9;
    t=now();
    for(int it=0;it<reps;it++) for(int w=0;w<W;w++) ggml_vec_dot_q6_K_q8_K_rows(n,&out[w],W,x6+w*nb,y,sizeof(block_q8_K)*nb,R);
    double t2=(now()-t)/reps/W/R/nb*1e9;
    int bad=memcmp(out,ref,sizeof(float)*R*W)!=0;
    // Q4_K
    t=now();
    for(int it=0;it<reps;it++) for(int r=0;r<R;r++) ggml_gemv_q4_K_8x8_q8_K(n,&ref[r*W],W,x4,y+r*nb,1,W);
    double t3=(now()-t)/reps/(W/8)/R/nb*1e9;
    t=now();
    for(int it=0;it<reps;it++) ggml_gemv_q4_K_8x8_q8_K_rows(n,out,W,x4,y,R,W);
    double t4=(now()-t)/reps/(W/8)/R/nb*1e9;
    int bad4=memcmp(out,ref,sizeof(float)*R*W)!=0;
    printf("rows %2d  Q6_K ns/superblock/row: one-row %.2f  rows %.2f %s | Q4_Kx8 ns/block/row: gemv %.2f rows %.2f %s\n",R,t1,t2,bad?"DIFF":"same",t3,t4,bad4?"DIFF":"same");
  }
  // the activation quantiser against the reference, then its speed: 16 rows of n values
  {
    const int k=n*16; float *xf=malloc(sizeof(float)*k);
    block_q8_K *qa=malloc(sizeof(block_q8_K)*k/QK_K), *qb=malloc(sizeof(block_q8_K)*k/QK_K);
    int bad=0;
    for(int trial=0;trial<500;trial++){
      for(int i=0;i<k;i++){ float v=((float)rand()/RAND_MAX-0.5f)*(trial%13+1);
        if(trial%4==1) v=(float)(rand()%21-10)*0.5f;          /* ties after scaling */
        if(trial%4==2 && (i/QK_K)%3==0) v=0.0f;                /* all-zero blocks */
        if(trial%4==3 && i%QK_K==9) v=-v-100.0f;               /* one large value per block */
        if(trial%4==3 && i%QK_K==200) v=100.0f+fabsf(xf[i-191]+100.0f);
        xf[i]=v; }
      memset(qa,0x5a,sizeof(block_q8_K)*k/QK_K); memset(qb,0x5a,sizeof(block_q8_K)*k/QK_K);
      quantize_row_q8_K_ref(xf,qa,k); quantize_row_q8_K(xf,qb,k);
      bad+=memcmp(qa,qb,sizeof(block_q8_K)*k/QK_K)!=0;
    }
    double t=now(); for(int it=0;it<2000;it++) quantize_row_q8_K_ref(xf,qa,k); double tr=(now()-t)/2000;
    t=now(); for(int it=0;it<2000;it++) quantize_row_q8_K(xf,qb,k); double tv=(now()-t)/2000;
    printf("activations to Q8_K, 16 rows of %d: reference %.1f us, quantize_row_q8_K %.1f us; 500 random sets %s\n",n,tr*1e6,tv*1e6,bad?"DIFF":"same");
  }
}
