/* Read by bindgen only (never compiled into code). mlx-c's half.h declares the
 * 16-bit float types only on aarch64, and libclang 14 cannot parse _Float16 or
 * __bf16 on x86_64. For parsing, both types are 16-bit integers and half.h is
 * skipped; the Rust types that mlx-rs expects are supplied as raw lines. */
#ifndef MLX_HALF_H
#define MLX_HALF_H
#include <stdint.h>
#define HAS_FLOAT16
#define HAS_BFLOAT16
typedef uint16_t float16_t;
typedef uint16_t bfloat16_t;
#endif
