// Symbols mlx-rs 0.33 needs on Linux that mlx-c 0.7.0 does not provide there.
#include <cstdint>
#include <cstring>
#include <ctime>
#include <dlfcn.h>

#include "mlx/c/error.h"
#include "mlx/c/private/array.h"

#if defined(__x86_64__)
// mlx-c declares its 16-bit float accessors only on aarch64; the bits are the
// same on every architecture, so expose them as raw 16-bit values.
extern "C" int mlx_array_item_float16(uint16_t* res, const mlx_array arr) {
  try {
    auto value = mlx_array_get_(arr).item<mlx::core::float16_t>();
    std::memcpy(res, &value, sizeof(uint16_t));
  } catch (std::exception& e) {
    mlx_error(e.what());
    return 1;
  }
  return 0;
}

extern "C" int mlx_array_item_bfloat16(uint16_t* res, const mlx_array arr) {
  try {
    auto value = mlx_array_get_(arr).item<mlx::core::bfloat16_t>();
    std::memcpy(res, &value, sizeof(uint16_t));
  } catch (std::exception& e) {
    mlx_error(e.what());
    return 1;
  }
  return 0;
}

extern "C" const uint16_t* mlx_array_data_float16(const mlx_array arr) {
  try {
    return reinterpret_cast<const uint16_t*>(
        mlx_array_get_(arr).data<mlx::core::float16_t>());
  } catch (std::exception& e) {
    mlx_error(e.what());
    return nullptr;
  }
}

extern "C" const uint16_t* mlx_array_data_bfloat16(const mlx_array arr) {
  try {
    return reinterpret_cast<const uint16_t*>(
        mlx_array_get_(arr).data<mlx::core::bfloat16_t>());
  } catch (std::exception& e) {
    mlx_error(e.what());
    return nullptr;
  }
}
#endif

// mlx-rs seeds its default random state from the Mach clock of macOS.
extern "C" uint64_t mach_approximate_time(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000000000ull +
         static_cast<uint64_t>(now.tv_nsec);
}

// Which BLAS the process actually loaded: OpenBLAS exports its configuration
// string; the reference (netlib) BLAS bundled with the MLX wheel does not.
extern "C" const char* mlx_spec_blas_config(void) {
  using config_fn = const char* (*)(void);
  auto openblas = reinterpret_cast<config_fn>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  if (openblas != nullptr) {
    return openblas();
  }
  return nullptr;
}

// Which float32 GEMM path the process uses: our row-invariant front
// (libmlx_spec_gemm.so, loaded as libmlx's first dependency) describes itself.
extern "C" const char* mlx_spec_gemm_config(void) {
  using describe_fn = const char* (*)(void);
  auto describe = reinterpret_cast<describe_fn>(dlsym(RTLD_DEFAULT, "mlx_spec_gemm_describe"));
  if (describe != nullptr) {
    return describe();
  }
  return nullptr;
}
