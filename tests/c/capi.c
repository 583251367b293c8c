/* Exercises the profiler.h API beyond start/stop. Built with -DUSE_API and -lcpuprof.
 *
 *   capi filter PATH   ProfilerStartWithOptions with a filter that drops one thread's samples
 *   capi state PATH    ProfilerGetCurrentState before/while/after, and ProfilerFlush (the
 *                      flushed file is copied to PATH.flushed before ProfilerStop)
 *   capi ownsig PATH   the program owns SIGPROF: profiling must leave its handler alone (with
 *                      per-thread timers it samples with another signal; with setitimer it
 *                      cannot start)
 *   capi stack         ProfilerGetStackTrace from three nested functions
 *   capi race PATH     8 threads start, flush, query and stop profiles at once, 25 times each
 *   capi afterstop PATH  SIGPROF arriving after ProfilerStop must be harmless
 * Prints "key value" lines for the test to check. */
#include <gperftools/profiler.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile unsigned long sink;
static __thread int excluded; /* initial-exec TLS in the executable: safe in a handler */

static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void allowed_work(double seconds) {
  double end = cpu_seconds() + seconds;
  while (cpu_seconds() < end)
    for (int i = 0; i < 100000; i++) sink += i * sink + 1;
}

__attribute__((noinline)) void excluded_work(double seconds) {
  double end = cpu_seconds() + seconds;
  while (cpu_seconds() < end)
    for (int i = 0; i < 100000; i++) sink += i * sink + 3;
}

static int keep_sample(void *arg) { return arg == (void *)&sink && !excluded; }

static void *excluded_thread(void *arg) {
  (void)arg;
  excluded = 1;
  excluded_work(1.0);
  return NULL;
}

static void copy_file(const char *from, const char *to) {
  FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
  char buf[65536];
  size_t n;
  while (in && out && (n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
  if (in) fclose(in);
  if (out) fclose(out);
}

static volatile sig_atomic_t own_handler_calls;
static void own_handler(int sig) { (void)sig; own_handler_calls++; }

static void *volatile trace[8];
static int trace_depth;
__attribute__((noinline)) void f3(void) { trace_depth = ProfilerGetStackTrace((void **)trace, 8, 0, NULL); __asm__ volatile(""); }
__attribute__((noinline)) void f2(void) { f3(); __asm__ volatile(""); }
__attribute__((noinline)) void f1(void) { f2(); __asm__ volatile(""); }

static const char *race_path;
static void *race_thread(void *arg) {
  long id = (long)arg;
  char path[4096];
  for (int i = 0; i < 25; i++) {
    snprintf(path, sizeof path, "%s.%ld", race_path, id);
    int started = ProfilerStart(path);
    allowed_work(0.002);
    ProfilerFlush();
    struct ProfilerState s;
    ProfilerGetCurrentState(&s);
    if (started) ProfilerStop();
  }
  return NULL;
}

static void print_state(const char *when) {
  struct ProfilerState s;
  memset(&s, 0x55, sizeof s);
  ProfilerGetCurrentState(&s);
  printf("%s_enabled %d\n%s_name %s\n%s_samples %d\n%s_age %ld\n", when, s.enabled, when, s.profile_name, when,
         s.samples_gathered, when, s.enabled ? (long)(time(NULL) - s.start_time) : -1L);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  const char *path = argc > 2 ? argv[2] : "capi.prof";
  if (!strcmp(mode, "filter")) {
    struct ProfilerOptions options;
    memset(&options, 0, sizeof options);
    options.filter_in_thread = keep_sample;
    options.filter_in_thread_arg = (void *)&sink;
    if (!ProfilerStartWithOptions(path, &options)) return 3;
    pthread_t t;
    pthread_create(&t, NULL, excluded_thread, NULL);
    allowed_work(1.0);
    pthread_join(t, NULL);
    ProfilerStop();
  } else if (!strcmp(mode, "state")) {
    print_state("before");
    if (!ProfilerStart(path)) return 3;
    allowed_work(0.5);
    print_state("during");
    ProfilerFlush();
    char flushed[4096];
    snprintf(flushed, sizeof flushed, "%s.flushed", path);
    copy_file(path, flushed);
    ProfilerStop();
    print_state("after");
  } else if (!strcmp(mode, "ownsig")) {
    signal(SIGPROF, own_handler);
    int started = ProfilerStart(path);
    printf("start %d\n", started);
    allowed_work(0.5);
    if (started) ProfilerStop();
    raise(SIGPROF);
    struct sigaction now;
    sigaction(SIGPROF, NULL, &now);
    printf("own_handler_calls %d\nhandler_kept %d\n", (int)own_handler_calls, now.sa_handler == own_handler);
  } else if (!strcmp(mode, "stack")) {
    f1();
    printf("depth %d\n", trace_depth);
    void *fns[3] = {(void *)f3, (void *)f2, (void *)f1};
    for (int i = 0; i < 3 && i < trace_depth; i++)
      printf("frame%d_offset %ld\n", i, (long)((uintptr_t)trace[i] - (uintptr_t)fns[i]));
  } else if (!strcmp(mode, "race")) {
    race_path = path;
    pthread_t t[8];
    for (long i = 0; i < 8; i++) pthread_create(&t[i], NULL, race_thread, (void *)i);
    for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
  } else if (!strcmp(mode, "afterstop")) {
    if (!ProfilerStart(path)) return 3;
    allowed_work(0.3);
    ProfilerStop();
    for (int i = 0; i < 10; i++) raise(SIGPROF);
    puts("survived");
  } else {
    return 2;
  }
  puts("done");
  return 0;
}
