/* Preloaded into the ranks of `ring.rs`'s teardown test: every
 * pthread_cond_wait sleeps `MLX_DISTRIBUTED_TEST_SLOW_WAIT_MS` before it
 * waits, the mutex still held. That widens the gap between a waiter
 * checking its predicate and sleeping, where a notify sent without the
 * mutex is lost: the race in MLX's ring teardown (see `ffi::init`), made
 * to happen on every exit instead of once in hundreds. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

int pthread_cond_wait(pthread_cond_t *cond, pthread_mutex_t *mutex) {
  static int (*real)(pthread_cond_t *, pthread_mutex_t *);
  if (!real) {
    /* x86_64's glibc keeps an old ABI's pthread_cond_wait beside the
     * current one (GLIBC_2.3.2), and dlsym may find the old one; aarch64's
     * has one version only. */
    real = dlvsym(RTLD_NEXT, "pthread_cond_wait", "GLIBC_2.3.2");
    if (!real) {
      real = dlsym(RTLD_NEXT, "pthread_cond_wait");
    }
    if (!real) {
      abort();
    }
  }
  const char *ms = getenv("MLX_DISTRIBUTED_TEST_SLOW_WAIT_MS");
  if (ms) {
    usleep(1000 * atoi(ms));
  }
  return real(cond, mutex);
}
