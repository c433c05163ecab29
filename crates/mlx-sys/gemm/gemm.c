/* mlx-spec's BLAS front: `cblas_sgemm` for libmlx, row-invariant.
 *
 * libmlx computes every float32 matmul through `cblas_sgemm`. OpenBLAS picks
 * kernels and reduction orders by the number of rows (M) and of threads, so a
 * row computed alone and the same row inside a verify window (or a batch, or
 * under another thread count) can differ in the last bits, and greedy
 * decoding then flips at near-ties. This library stands in for the BLAS
 * libmlx loads: every row-major float32 product runs on our kernels
 * (kernel.h), whose result for an element depends only on its row of A, its
 * column of B, K and the machine's instruction set (chosen once per
 * process). Everything else goes to the next BLAS in the load order
 * (OpenBLAS).
 *
 * Environment: MLX_SPEC_GEMM_ISA=avx2|portable runs a lower instruction-set
 * level than the CPU's best (to test every kernel on one machine);
 * MLX_SPEC_GEMM=blas forwards every product (benchmarks only:
 * gives up row invariance); MLX_SPEC_GEMM_MAX_M=N forwards products of more
 * than N rows (prefill on OpenBLAS: faster at large M, but then a prompt's
 * caches depend on the thread count and chunking); MLX_SPEC_GEMM_THREADS=N
 * (default: OpenBLAS's thread count). Results never depend on the thread
 * count: threads split N (or M), never K. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

enum { RowMajor = 101, ColMajor = 102 };
enum { NoTrans = 111, Trans = 112, ConjTrans = 113 };

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float*, int,
                         const float*, int, float, float*, int);

struct gemm_args {
  int M, N, K;
  const float* A; /* row-major [M, K] */
  long lda;
  const float* B; /* [N, K] when b_transposed, else [K, N] */
  long ldb;
  int b_transposed;
  float alpha, beta;
  float* C;
  long ldc;
};

/* BLAS semantics: beta == 0 never reads C. */
static inline __attribute__((always_inline)) void store_element(const struct gemm_args* g, int m, int n,
                                                                float sum) {
  float* c = g->C + m * g->ldc + n;
  float scaled = g->alpha == 1.0f ? sum : g->alpha * sum;
  *c = g->beta == 0.0f ? scaled : scaled + g->beta * *c;
}

/* Work is split and chunked in multiples of every ISA's tile (4 or 6 rows,
 * 3 or 4 columns or vectors), so only the edges of a product see partial
 * tiles (which compute the same values, only slower). */
#define ROW_STEP 12
#define DOT_COL_STEP 12
#define AXPY_COL_STEP 192

/* Rows of A kept in cache (about 192 KiB) while blocks of B pass by them. */
static inline int rows_per_chunk(int K) {
  int rows = K > 0 ? 49152 / K : 252;
  rows -= rows % ROW_STEP;
  return rows < ROW_STEP ? ROW_STEP : (rows > 252 ? 252 : rows);
}

#define PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define BEGIN_TARGET(t) PRAGMA(clang attribute push(__attribute__((target(t))), apply_to = function))
#define END_TARGET() PRAGMA(clang attribute pop)
#else
#define BEGIN_TARGET(t) PRAGMA(GCC push_options) PRAGMA(GCC target(t))
#define END_TARGET() PRAGMA(GCC pop_options)
#endif

/* ---- x86_64: AVX-512F, AVX2 + FMA ---- */
#if defined(__x86_64__)
BEGIN_TARGET("avx512f,fma")
#define ISA(name) name##_avx512
#define V __m512
#define W 16
#define MR 6 /* 24 accumulators of 32 registers */
#define NR 4
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VBCAST(s) _mm512_set1_ps(s)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define SFMA(a, b, c) __builtin_fmaf(a, b, c)
static inline __attribute__((always_inline)) float hsum_avx512(__m512 v) {
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
  return _mm_cvtss_f32(q);
}
#define HSUM(v) hsum_avx512(v)
#include "kernel.h"
END_TARGET()

BEGIN_TARGET("avx2,fma")
#define ISA(name) name##_avx2
#define V __m256
#define W 8
#define MR 4 /* 12 accumulators + 3 + 1 of 16 registers */
#define NR 3
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VBCAST(s) _mm256_set1_ps(s)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define SFMA(a, b, c) __builtin_fmaf(a, b, c)
static inline __attribute__((always_inline)) float hsum_avx2(__m256 v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
  return _mm_cvtss_f32(q);
}
#define HSUM(v) hsum_avx2(v)
#include "kernel.h"
END_TARGET()
#endif

/* ---- aarch64: NEON (always present) ---- */
#if defined(__aarch64__)
#define ISA(name) name##_neon
#define V float32x4_t
#define W 4
#define MR 4 /* 16 accumulators of 32 registers */
#define NR 4
#define VZERO() vdupq_n_f32(0.0f)
#define VLOAD(p) vld1q_f32(p)
#define VBCAST(s) vdupq_n_f32(s)
#define VFMA(a, b, c) vfmaq_f32(c, a, b)
#define VSTORE(p, v) vst1q_f32(p, v)
#define SFMA(a, b, c) __builtin_fmaf(a, b, c)
static inline __attribute__((always_inline)) float hsum_neon(float32x4_t v) {
  float32x2_t s = vadd_f32(vget_low_f32(v), vget_high_f32(v));
  return vget_lane_f32(s, 0) + vget_lane_f32(s, 1);
}
#define HSUM(v) hsum_neon(v)
#include "kernel.h"
#endif

/* ---- portable fallback: four lanes, unfused (built with -ffp-contract=off) ---- */
typedef float v4f __attribute__((vector_size(16)));
#define ISA(name) name##_portable
#define V v4f
#define W 4
#define MR 4 /* SSE2's 16 registers */
#define NR 3
#define VZERO() ((v4f){0.0f, 0.0f, 0.0f, 0.0f})
static inline __attribute__((always_inline)) v4f load_v4f(const float* p) {
  v4f v;
  memcpy(&v, p, sizeof v);
  return v;
}
#define VLOAD(p) load_v4f(p)
#define VBCAST(s) ((v4f){(s), (s), (s), (s)})
#define VFMA(a, b, c) ((a) * (b) + (c))
#define VSTORE(p, v) memcpy((p), &(v), sizeof(v4f))
#define SFMA(a, b, c) ((a) * (b) + (c))
#define HSUM(v) (((v)[0] + (v)[2]) + ((v)[1] + (v)[3]))
#include "kernel.h"

/* ---- process-wide configuration, chosen once ---- */
typedef void (*range_fn)(const struct gemm_args*, int, int, int, int);

static struct {
  pthread_once_t once;
  sgemm_fn next; /* the BLAS behind us */
  range_fn kernel;
  const char* isa;
  int enabled;
  int max_m;
  int threads;
} cfg = {PTHREAD_ONCE_INIT, NULL, NULL, "portable", 1, INT32_MAX, 1};

static int env_int(const char* name, int fallback, int lo, int hi) {
  const char* text = getenv(name);
  if (text == NULL || *text == '\0') return fallback;
  char* end = NULL;
  long value = strtol(text, &end, 10);
  if (*end != '\0' || value < lo || value > hi) return fallback;
  return (int)value;
}

static void init_once(void) {
  cfg.next = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
  if (cfg.next == NULL) {
    void* blas = dlopen("libblas.so.3", RTLD_NOW | RTLD_NOLOAD);
    if (blas != NULL) cfg.next = (sgemm_fn)dlsym(blas, "cblas_sgemm");
  }
  /* MLX_SPEC_GEMM_ISA=avx2|portable picks a lower level than the CPU's best
   * (tests of every kernel on one machine); a level the CPU lacks is ignored. */
  const char* isa = getenv("MLX_SPEC_GEMM_ISA");
  int allow_avx512 = isa == NULL || strcmp(isa, "avx512f") == 0;
  int allow_avx2 = allow_avx512 || strcmp(isa, "avx2") == 0;
  cfg.kernel = gemm_range_portable;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (allow_avx512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) {
    cfg.kernel = gemm_range_avx512;
    cfg.isa = "avx512f";
  } else if (allow_avx2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    cfg.kernel = gemm_range_avx2;
    cfg.isa = "avx2+fma";
  }
#elif defined(__aarch64__)
  if (allow_avx2) {
    cfg.kernel = gemm_range_neon;
    cfg.isa = "neon";
  }
#endif
  const char* mode = getenv("MLX_SPEC_GEMM");
  cfg.enabled = !(mode != NULL && strcmp(mode, "blas") == 0);
  cfg.max_m = env_int("MLX_SPEC_GEMM_MAX_M", INT32_MAX, 0, INT32_MAX);
  typedef int (*threads_fn)(void);
  threads_fn openblas_threads = (threads_fn)dlsym(RTLD_DEFAULT, "openblas_get_num_threads");
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int fallback = openblas_threads != NULL ? openblas_threads() : (int)(cpus > 0 ? cpus : 1);
  cfg.threads = env_int("MLX_SPEC_GEMM_THREADS", fallback, 1, 256);
}

/* ---- a small thread pool: workers spin briefly, then sleep ---- */

/* One turn of a wait loop, `spins` turns in: a pause first (on an idle
 * machine the next product or the other part comes within microseconds),
 * then a yield of the core (on a loaded one the thread waited for may need
 * this very core: spinning on would keep it off). */
#define PAUSE_SPINS 2000
static inline void relax(int spins) {
  if (spins < PAUSE_SPINS) {
#if defined(__x86_64__)
    _mm_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
  } else {
    sched_yield();
  }
}

/* Turns a worker waits for the next product before it sleeps. */
#define WAIT_SPINS (PAUSE_SPINS + 20000)
#define MAX_THREADS 256
static struct {
  pthread_mutex_t busy; /* one product at a time uses the pool */
  pthread_mutex_t mu;
  pthread_cond_t wake;
  atomic_uint generation;
  atomic_int pending;
  atomic_int sleepers;
  int workers;
  int parts;
  const struct gemm_args* job;
  int step;       /* the split extent goes in multiples of this */
  int split_rows; /* split M instead of N */
  unsigned created_at; /* the generation a new worker starts from */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0, NULL, 1, 0, 0};

/* Part `part` of `pool.parts`: a range of columns, or of rows when there are
 * too few columns to share (which range a thread takes never changes what
 * an element's value is). */
static void run_part(int part) {
  const struct gemm_args* g = pool.job;
  const int extent = pool.split_rows ? g->M : g->N;
  int blocks = (extent + pool.step - 1) / pool.step;
  int per = (blocks + pool.parts - 1) / pool.parts;
  int lo = part * per * pool.step;
  int hi = (part + 1) * per * pool.step;
  if (hi > extent) hi = extent;
  if (lo >= hi) return;
  if (pool.split_rows) {
    cfg.kernel(g, lo, hi, 0, g->N);
  } else {
    cfg.kernel(g, 0, g->M, lo, hi);
  }
}

static void* worker(void* arg) {
  int index = (int)(intptr_t)arg;
  unsigned seen = pool.created_at;
  for (;;) {
    unsigned now;
    int spins = 0;
    while ((now = atomic_load(&pool.generation)) == seen && spins < WAIT_SPINS) relax(spins++);
    if (now == seen) {
      pthread_mutex_lock(&pool.mu);
      atomic_fetch_add(&pool.sleepers, 1);
      while ((now = atomic_load(&pool.generation)) == seen) pthread_cond_wait(&pool.wake, &pool.mu);
      atomic_fetch_sub(&pool.sleepers, 1);
      pthread_mutex_unlock(&pool.mu);
    }
    seen = now;
    if (index < pool.parts) run_part(index);
    atomic_fetch_sub(&pool.pending, 1);
  }
  return NULL;
}

static void forget_pool_in_child(void) {
  /* A forked child has none of the parent's workers. */
  pool.workers = 0;
  pthread_mutex_init(&pool.busy, NULL);
  pthread_mutex_init(&pool.mu, NULL);
  pthread_cond_init(&pool.wake, NULL);
}

static void register_atfork(void) { pthread_atfork(NULL, NULL, forget_pool_in_child); }

/* Called with `pool.busy` held, before the generation moves. */
static int start_workers(int wanted) {
  static pthread_once_t atfork = PTHREAD_ONCE_INIT;
  pthread_once(&atfork, register_atfork);
  pool.created_at = atomic_load(&pool.generation);
  while (pool.workers < wanted && pool.workers < MAX_THREADS - 1) {
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int failed = pthread_create(&thread, &attr, worker, (void*)(intptr_t)(pool.workers + 1));
    pthread_attr_destroy(&attr);
    if (failed) break;
    pool.workers++;
  }
  return pool.workers;
}

static void run(const struct gemm_args* g) {
  int step = g->b_transposed ? DOT_COL_STEP : AXPY_COL_STEP;
  int split_rows = 0;
  double work = (double)g->M * g->N * g->K;
  int parts = cfg.threads;
  if (g->N < 2 * step) {
    /* Few columns (attention values): share the rows instead. */
    split_rows = 1;
    step = ROW_STEP;
    if (g->M < 2 * step) parts = 1;
  }
  if (work < 262144.0) parts = 1;
  if (parts > 1 && pthread_mutex_trylock(&pool.busy) != 0) parts = 1;
  if (parts == 1) {
    cfg.kernel(g, 0, g->M, 0, g->N);
    return;
  }
  int workers = start_workers(parts - 1);
  if (workers + 1 < parts) parts = workers + 1;
  pool.job = g;
  pool.parts = parts;
  pool.step = step;
  pool.split_rows = split_rows;
  atomic_store(&pool.pending, workers);
  atomic_fetch_add(&pool.generation, 1);
  if (atomic_load(&pool.sleepers) > 0) {
    pthread_mutex_lock(&pool.mu);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
  }
  run_part(0);
  for (int spins = 0; atomic_load(&pool.pending) > 0; spins++) relax(spins);
  pthread_mutex_unlock(&pool.busy);
}

/* Which kernels this process uses (for reports and tests). */
const char* mlx_spec_gemm_describe(void) {
  pthread_once(&cfg.once, init_once);
  static char text[96];
  if (!cfg.enabled) return "blas (row-invariant kernels off: MLX_SPEC_GEMM=blas)";
  if (cfg.max_m == INT32_MAX) {
    snprintf(text, sizeof text, "row-invariant %s, every product, %d threads", cfg.isa, cfg.threads);
  } else {
    snprintf(text, sizeof text, "row-invariant %s, M <= %d (larger on the BLAS), %d threads", cfg.isa, cfg.max_m, cfg.threads);
  }
  return text;
}

void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  pthread_once(&cfg.once, init_once);
  int ours = cfg.enabled && order == RowMajor && M > 0 && N > 0 && M <= cfg.max_m;
  if (!ours && cfg.next != NULL) {
    cfg.next(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  if (M <= 0 || N <= 0) return;
  if (order != RowMajor) {
    /* Column-major C = op(A) op(B) is row-major C^T = op(B)^T op(A)^T. */
    cblas_sgemm(RowMajor, trans_b, trans_a, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc);
    return;
  }
  struct gemm_args g = {M, N, K, A, lda, B, ldb, trans_b != NoTrans, alpha, beta, C, ldc};
  float* packed = NULL;
  if (trans_a != NoTrans) {
    /* A arrives as [K, M]: our kernels read rows, so copy it row-major. */
    packed = malloc((size_t)M * (size_t)(K > 0 ? K : 1) * sizeof(float));
    if (packed == NULL) {
      /* Out of memory: the BLAS behind us still computes the product. */
      if (cfg.next != NULL) cfg.next(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    }
    for (int m = 0; m < M; m++)
      for (int k = 0; k < K; k++) packed[(size_t)m * K + k] = A[(size_t)k * lda + m];
    g.A = packed;
    g.lda = K;
  }
  run(&g);
  free(packed);
}
