/* A standalone check of the GEMM front's kernels, linked with gemm.c alone
 * (no MLX, no BLAS): for each shape, every row of an M-row product (M = 1..33)
 * equals the row computed alone, bit for bit, and the values agree with a
 * float64 reference. `crates/mlx-sys/tests/other_arch.rs` builds it for the
 * other CPU architecture and runs it under QEMU, so the NEON kernels are
 * checked on x86_64 machines (and the x86 ones on aarch64 machines).
 * Prints one line per shape; exits non-zero on any failure. */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc);
const char* mlx_spec_gemm_describe(void);

static unsigned long long state = 0x6d6c78737065636bull;

static float next_value(void) {
  state = state * 6364136223846793005ull + 1442695040888963407ull;
  return (float)(state >> 40) / (float)(1ull << 24) - 0.5f;
}

static int check(int K, int N, int b_transposed) {
  enum { ROWS = 33 };
  float* a = malloc(sizeof(float) * ROWS * K);
  float* b = malloc(sizeof(float) * N * K);
  float* alone = malloc(sizeof(float) * ROWS * N);
  float* together = malloc(sizeof(float) * ROWS * N);
  if (!a || !b || !alone || !together) return 1;
  for (int i = 0; i < ROWS * K; i++) a[i] = next_value();
  for (int i = 0; i < N * K; i++) b[i] = next_value();
  const int trans = b_transposed ? 112 : 111, ldb = b_transposed ? K : N;
  for (int m = 0; m < ROWS; m++) cblas_sgemm(101, 111, trans, 1, N, K, 1.0f, a + m * K, K, b, ldb, 0.0f, alone + m * N, N);
  int differ = 0;
  for (int rows = 2; rows <= ROWS; rows++) {
    cblas_sgemm(101, 111, trans, rows, N, K, 1.0f, a, K, b, ldb, 0.0f, together, N);
    if (memcmp(together, alone, sizeof(float) * rows * N) != 0) differ++;
  }
  double worst = 0.0;
  for (int m = 0; m < ROWS; m++) {
    for (int n = 0; n < N; n++) {
      double sum = 0.0;
      for (int k = 0; k < K; k++) sum += (double)a[m * K + k] * (b_transposed ? b[n * K + k] : b[k * N + n]);
      double err = fabs(sum - alone[m * N + n]) / (1.0 + fabs(sum));
      if (err > worst) worst = err;
    }
  }
  printf("K=%d N=%d B %s: %d of 32 row counts differ from rows alone, worst relative error %.1e\n", K, N,
         b_transposed ? "transposed" : "as is", differ, worst);
  free(a);
  free(b);
  free(alone);
  free(together);
  return differ != 0 || worst > 1e-4;
}

int main(void) {
  printf("%s\n", mlx_spec_gemm_describe());
  const int shapes[][3] = {{576, 300, 1}, {77, 45, 1}, {77, 45, 0}, {64, 129, 1}, {300, 64, 0}, {1, 7, 1}, {5, 3, 0}};
  int failed = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) failed |= check(shapes[i][0], shapes[i][1], shapes[i][2]);
  return failed;
}
