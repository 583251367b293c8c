/* The C-variadic members of the exec family, which stable Rust cannot define: each gathers
 * its arguments into an array and calls the array form, which libcpuprof.so interposes (so
 * the profile is prepared for the exec as for execv, execvp and execve). glibc's own execl,
 * execlp and execle call its internal execve directly, which no interposer sees: without
 * these a forked child's `fork(); execl(...)` skipped cpuprof's exec handling altogether.
 *
 * The exported symbols are Rust naked functions that jump here (lib.rs): rustc exports only
 * Rust items from a cdylib. */
#include <stdarg.h>
#include <stddef.h>
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
