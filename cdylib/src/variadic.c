/* The C-variadic functions libcpuprof.so interposes, which stable Rust cannot define.
 *
 * execl, execlp, execle: each gathers its arguments into an array and calls the array form,
 * which libcpuprof.so interposes (so the profile is prepared for the exec as for execv, execvp
 * and execve). glibc's own call its internal execve directly, which no interposer sees:
 * without these a forked child's `fork(); execl(...)` skipped cpuprof's exec handling.
 *
 * clone: a thread made with glibc's clone wrapper (CLONE_THREAD) rather than pthread_create
 * starts the profile's waiting writer first, as pthread_create does (writer::threadless):
 * the writer's poll then finds and arms it, where the signal handler, which looks for such
 * threads too, runs only while a thread already armed runs.
 *
 * syscall: futex waits (`syscall(SYS_futex, ..., FUTEX_WAIT...)`, how Rust's std::sync and
 * parking_lot block) are timed for the contention profile while one runs (contention.rs); every
 * other call is passed on with its six argument registers, as glibc's syscall reads them.
 *
 * The exported symbols are Rust naked functions that jump here (lib.rs): rustc exports only
 * Rust items from a cdylib. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/types.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define HIDDEN __attribute__((visibility("hidden")))

/* `first` and the `count` - 1 variadic arguments after it into `argv`; `ap` is left at the
 * NULL that ends them. */
#define GATHER(first, argv, count, ap)                                                    \
  do {                                                                                    \
    (argv)[0] = (first);                                                                  \
    for (size_t i_ = 1; i_ < (count); i_++) (argv)[i_] = va_arg((ap), char *);            \
  } while (0)

/* The arguments before the NULL that ends them, `first` included. */
#define COUNT(first, last_named, count)                                                   \
  do {                                                                                    \
    va_list c_;                                                                           \
    va_start(c_, last_named);                                                             \
    (count) = 0;                                                                          \
    if ((first) != NULL)                                                                  \
      for ((count) = 1; va_arg(c_, char *) != NULL; (count)++) {                          \
      }                                                                                   \
    va_end(c_);                                                                           \
  } while (0)

HIDDEN int cpuprof_execl(const char *path, const char *arg, ...) {
  size_t n;
  COUNT(arg, arg, n);
  char *argv[n + 1];
  va_list ap;
  va_start(ap, arg);
  GATHER((char *)arg, argv, n, ap);
  va_end(ap);
  argv[n] = NULL;
  return execv(path, argv);
}

HIDDEN int cpuprof_execlp(const char *file, const char *arg, ...) {
  size_t n;
  COUNT(arg, arg, n);
  char *argv[n + 1];
  va_list ap;
  va_start(ap, arg);
  GATHER((char *)arg, argv, n, ap);
  va_end(ap);
  argv[n] = NULL;
  return execvp(file, argv);
}

HIDDEN int cpuprof_execle(const char *path, const char *arg, ...) {
  size_t n;
  COUNT(arg, arg, n);
  char *argv[n + 1];
  va_list ap;
  va_start(ap, arg);
  GATHER((char *)arg, argv, n, ap);
  if (n > 0) (void)va_arg(ap, char *); /* the NULL after the arguments */
  char *const *envp = va_arg(ap, char *const *);
  va_end(ap);
  argv[n] = NULL;
  return execve(path, argv, envp);
}

typedef int (*clone_fn)(int (*)(void *), void *, int, void *, ...);

/* What runs before a thread is cloned (set once at load by lib.rs). */
static void (*before_thread_clone)(void);

HIDDEN void cpuprof_set_before_thread_clone(void (*hook)(void)) { before_thread_clone = hook; }

HIDDEN int cpuprof_clone(int (*fn)(void *), void *stack, int flags, void *arg, ...) {
  /* The optional arguments, passed on as received: glibc's clone reads only those its flags
   * ask for. */
  va_list ap;
  va_start(ap, arg);
  pid_t *parent_tid = va_arg(ap, pid_t *);
  void *tls = va_arg(ap, void *);
  pid_t *child_tid = va_arg(ap, pid_t *);
  va_end(ap);
  static clone_fn real;
  if (real == NULL) real = (clone_fn)dlsym(RTLD_NEXT, "clone");
  if (real == NULL) {
    errno = ENOSYS;
    return -1;
  }
  if ((flags & CLONE_THREAD) && before_thread_clone != NULL) before_thread_clone();
  return real(fn, stack, flags, arg, parent_tid, tls, child_tid);
}

/* contention.rs: whether a contention profile runs, where a timed futex wait goes (counted
 * among the futex's waiters while it lasts, for the holder's view), and what a wake charges
 * the waker; set at load (cpuprof_set_futex_hooks), before which futex calls pass untimed. */
static int (*contention_running)(void);
static intptr_t (*futex_arrive)(uintptr_t futex, uint64_t start_ns);
static void (*futex_waited)(uint64_t delay_ns, intptr_t slot);
static uint64_t (*futex_waking)(uintptr_t futex);
static void (*futex_woke)(uint64_t delay_ns);

typedef long (*syscall_fn)(long, ...);
static syscall_fn next_syscall;

/* Also finds the next syscall at load: a first call from a signal handler must not dlsym. */
HIDDEN void cpuprof_set_futex_hooks(int (*running)(void), intptr_t (*arrive)(uintptr_t, uint64_t),
                                    void (*waited)(uint64_t, intptr_t), uint64_t (*waking)(uintptr_t),
                                    void (*woke)(uint64_t)) {
  if (__atomic_load_n(&next_syscall, __ATOMIC_RELAXED) == NULL)
    __atomic_store_n(&next_syscall, (syscall_fn)dlsym(RTLD_NEXT, "syscall"), __ATOMIC_RELAXED);
  __atomic_store_n(&futex_arrive, arrive, __ATOMIC_RELAXED);
  __atomic_store_n(&futex_waited, waited, __ATOMIC_RELAXED);
  __atomic_store_n(&futex_waking, waking, __ATOMIC_RELAXED);
  __atomic_store_n(&futex_woke, woke, __ATOMIC_RELAXED);
  __atomic_store_n(&contention_running, running, __ATOMIC_RELEASE);
}

static uint64_t monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The futex operations that block until another thread acts: what a lock's waiter calls. */
static int is_futex_wait(long op) {
  switch (op & FUTEX_CMD_MASK) {
    case FUTEX_WAIT:
    case FUTEX_WAIT_BITSET:
    case FUTEX_LOCK_PI:
#ifdef FUTEX_LOCK_PI2
    case FUTEX_LOCK_PI2:
#endif
      return 1;
    default:
      return 0;
  }
}

/* The futex operations that wake a waiter: what a lock's releaser calls. */
static int is_futex_wake(long op) {
  switch (op & FUTEX_CMD_MASK) {
    case FUTEX_WAKE:
    case FUTEX_WAKE_BITSET:
    case FUTEX_UNLOCK_PI:
      return 1;
    default:
      return 0;
  }
}

HIDDEN long cpuprof_syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long);
  long d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
  va_end(ap);
  syscall_fn next = __atomic_load_n(&next_syscall, __ATOMIC_RELAXED);
  if (next == NULL) {
    next = (syscall_fn)dlsym(RTLD_NEXT, "syscall");
    __atomic_store_n(&next_syscall, next, __ATOMIC_RELAXED);
  }
  int (*running)(void) = __atomic_load_n(&contention_running, __ATOMIC_ACQUIRE);
  if (number != SYS_futex || running == NULL || !running()) return next(number, a, b, c, d, e, f);
  if (is_futex_wake(b)) {
    /* Taken before the wake, or the waiter woken could leave first and take its wait along. */
    uint64_t delay = futex_waking((uintptr_t)a);
    long result = next(number, a, b, c, d, e, f);
    if (delay > 0) futex_woke(delay);
    return result;
  }
  if (!is_futex_wait(b)) return next(number, a, b, c, d, e, f);
  uint64_t start = monotonic_ns();
  intptr_t slot = futex_arrive((uintptr_t)a, start);
  long result = next(number, a, b, c, d, e, f);
  futex_waited(monotonic_ns() - start, slot);
  return result;
}
