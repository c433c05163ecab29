/* The row-invariant float32 GEMM kernels, instantiated once per instruction
 * set by gemm.c (which defines the vector macros below before including this
 * file).
 *
 * The invariant: every output element C[m][n] is reduced in one fixed order
 * that depends on K alone, never on M, on N, on the tile the element falls in
 * or on the thread that computes it:
 *  - B transposed (B is [N, K], a weight matrix under `x @ W.T`): lane l of one
 *    accumulator takes the products of k = l, l + W, l + 2W, ... in order with
 *    fused multiply-adds; a K tail is zero-padded into the same lanes; the
 *    lanes are summed by one fixed tree (HSUM).
 *  - B not transposed (B is [K, N], attention values): one fused
 *    multiply-add chain over k = 0, 1, ..., K - 1, vector lanes or scalar
 *    alike (SFMA rounds exactly as one lane of VFMA).
 * Trailing zero terms (masked attention positions) leave either order's sum
 * unchanged, so a query row gives the same bits whatever number of masked
 * keys follows it.
 *
 * Required macros: ISA(name), V, W, VZERO(), VLOAD(p), VBCAST(s),
 * VFMA(a, b, c) (a * b + c), VSTORE(p, v), HSUM(v), SFMA(a, b, c), and the
 * tile: MR rows of A (4 or 6) by NR rows of B or vectors of B columns (3 or
 * 4), sized so the MR * NR accumulators stay in the ISA's registers. This
 * file undefines them all at its end. */

/* Every tile shape up to MR x NR as `CASE(rows, cols)`: constant shapes let
 * the compiler keep the accumulators in registers. */
#if NR == 4
#define TILE_COL4(CASE, R) CASE(R, 4)
#else
#define TILE_COL4(CASE, R)
#endif
#define TILE_ROW(CASE, R) CASE(R, 1) CASE(R, 2) CASE(R, 3) TILE_COL4(CASE, R)
#if MR == 6
#define TILE_ROWS56(CASE) TILE_ROW(CASE, 5) TILE_ROW(CASE, 6)
#else
#define TILE_ROWS56(CASE)
#endif
#define TILE_SHAPES(CASE) \
  TILE_ROW(CASE, 1) TILE_ROW(CASE, 2) TILE_ROW(CASE, 3) TILE_ROW(CASE, 4) TILE_ROWS56(CASE)

static inline __attribute__((always_inline)) V ISA(load_padded)(const float* p, int n) {
  float buf[W] = {0};
  memcpy(buf, p, (size_t)n * sizeof(float));
  return VLOAD(buf);
}

/* `ahead`: where the next block of B starts (NULL: nothing to fetch). The
 * loop touches it a cache line or so per step, so the weights stream in from
 * memory while this block computes. */
static inline __attribute__((always_inline)) void ISA(dot_tile)(
    const int mr, const int nr, const int K, const float* A, const long lda,
    const float* B, const long ldb, float out[MR][NR], const float* ahead) {
  V acc[MR][NR];
  for (int i = 0; i < mr; i++)
    for (int j = 0; j < nr; j++) acc[i][j] = VZERO();
  int k = 0;
  for (; k + W <= K; k += W) {
    if (ahead != NULL)
      for (int p = 0; p < NR * W; p += 16) __builtin_prefetch(ahead + (long)k * NR + p);
    V b[NR];
    for (int j = 0; j < nr; j++) b[j] = VLOAD(B + j * ldb + k);
    for (int i = 0; i < mr; i++) {
      V a = VLOAD(A + i * lda + k);
      for (int j = 0; j < nr; j++) acc[i][j] = VFMA(a, b[j], acc[i][j]);
    }
  }
  if (k < K) {
    V b[NR];
    for (int j = 0; j < nr; j++) b[j] = ISA(load_padded)(B + j * ldb + k, K - k);
    for (int i = 0; i < mr; i++) {
      V a = ISA(load_padded)(A + i * lda + k, K - k);
      for (int j = 0; j < nr; j++) acc[i][j] = VFMA(a, b[j], acc[i][j]);
    }
  }
  for (int i = 0; i < mr; i++)
    for (int j = 0; j < nr; j++) out[i][j] = HSUM(acc[i][j]);
}

/* C[m0:m1, n0:n1] for B transposed. Rows go in chunks that stay in cache
 * while a block of B rows is reused against them. */
static void ISA(dot_range)(const struct gemm_args* g, int m0, int m1, int n0, int n1) {
  float out[MR][NR];
  const int chunk = rows_per_chunk(g->K);
  for (int mc = m0; mc < m1; mc += chunk) {
    const int mend = m1 - mc < chunk ? m1 : mc + chunk;
    for (int n = n0; n < n1; n += NR) {
      const int nr = n1 - n < NR ? n1 - n : NR;
      for (int m = mc; m < mend; m += MR) {
        const int mr = mend - m < MR ? mend - m : MR;
        const float* a = g->A + m * g->lda;
        const float* b = g->B + n * g->ldb;
        /* The first row tile of a block fetches the block after next. */
        const float* ahead = m == mc && n + 2 * NR < n1 ? g->B + (n + 2 * NR) * g->ldb : NULL;
        /* The arithmetic per element is the same in every tile shape. */
#define DOT_CASE(R, C) \
  case (R) * 8 + (C):  \
    ISA(dot_tile)(R, C, g->K, a, g->lda, b, g->ldb, out, ahead); \
    break;
        switch (mr * 8 + nr) {
          TILE_SHAPES(DOT_CASE)
          default: break;
        }
#undef DOT_CASE
        for (int i = 0; i < mr; i++)
          for (int j = 0; j < nr; j++) store_element(g, m + i, n + j, out[i][j]);
      }
    }
  }
}

static inline __attribute__((always_inline)) void ISA(axpy_tile)(
    const int mr, const int nv, const int K, const float* A, const long lda,
    const float* B, const long ldb, float out[MR][NR * W]) {
  V acc[MR][NR];
  for (int i = 0; i < mr; i++)
    for (int v = 0; v < nv; v++) acc[i][v] = VZERO();
  for (int k = 0; k < K; k++) {
    V b[NR];
    for (int v = 0; v < nv; v++) b[v] = VLOAD(B + k * ldb + v * W);
    for (int i = 0; i < mr; i++) {
      V a = VBCAST(A[i * lda + k]);
      for (int v = 0; v < nv; v++) acc[i][v] = VFMA(a, b[v], acc[i][v]);
    }
  }
  for (int i = 0; i < mr; i++)
    for (int v = 0; v < nv; v++) VSTORE(&out[i][v * W], acc[i][v]);
}

/* C[m0:m1, n0:n1] for B not transposed. */
static void ISA(axpy_range)(const struct gemm_args* g, int m0, int m1, int n0, int n1) {
  float out[MR][NR * W];
  int n = n0;
  for (; n + W <= n1; n += NR * W) {
    const int cols = n1 - n < NR * W ? ((n1 - n) / W) * W : NR * W;
    const int nv = cols / W;
    for (int m = m0; m < m1; m += MR) {
      const int mr = m1 - m < MR ? m1 - m : MR;
      const float* a = g->A + m * g->lda;
      const float* b = g->B + n;
#define AXPY_CASE(R, C) \
  case (R) * 8 + (C):   \
    ISA(axpy_tile)(R, C, g->K, a, g->lda, b, g->ldb, out); \
    break;
      switch (mr * 8 + nv) {
        TILE_SHAPES(AXPY_CASE)
        default: break;
      }
#undef AXPY_CASE
      for (int i = 0; i < mr; i++)
        for (int j = 0; j < cols; j++) store_element(g, m + i, n + j, out[i][j]);
    }
    if (cols < NR * W) {
      n += cols;
      break;
    }
  }
  /* Columns past the last full vector: the same chain, one lane at a time. */
  for (; n < n1; n++) {
    for (int m = m0; m < m1; m++) {
      float acc = 0.0f;
      for (int k = 0; k < g->K; k++) acc = SFMA(g->A[m * g->lda + k], g->B[k * g->ldb + n], acc);
      store_element(g, m, n, acc);
    }
  }
}

static void ISA(gemm_range)(const struct gemm_args* g, int m0, int m1, int n0, int n1) {
  if (g->b_transposed) {
    ISA(dot_range)(g, m0, m1, n0, n1);
  } else {
    ISA(axpy_range)(g, m0, m1, n0, n1);
  }
}

#undef TILE_COL4
#undef TILE_ROW
#undef TILE_ROWS56
#undef TILE_SHAPES
/* The includer's macros too, ready for the next instruction set. */
#undef ISA
#undef V
#undef W
#undef MR
#undef NR
#undef VZERO
#undef VLOAD
#undef VBCAST
#undef VFMA
#undef VSTORE
#undef SFMA
#undef HSUM
