/* Threads made with the clone system call's glibc wrapper instead of pthread_create, so no
 * interposer announces them and none runs a key destructor at their end: only the profiler's
 * poll of /proc/self/task can find them. They share the creating thread's TLS (no
 * CLONE_SETTLS), as minimal runtimes do, so they call nothing that uses it but raw system calls.
 *
 *   raw_clone relay CHAINS LINKS MS   after 2.5 s of sleep (a quiet process, whose poll has
 *       backed off), CHAINS relays of LINKS raw threads each: a link burns MS ms of its own CPU
 *       time in raw_link, then clones the next link and ends, so the thread count stays the
 *       same. main burns LINKS x MS ms meanwhile. Prints "links N" (links run)
 *       and, on stderr, "cpu SECONDS" (the process's CPU time).
 *   raw_clone sparse ROUNDS MS        ROUNDS times: 3 s of sleep, then one raw thread burns MS ms
 *       of its CPU time in raw_link and ends, then main burns MS ms. Prints "rounds N" and,
 *       on stderr, "cpu SECONDS".
 *   raw_clone churn THREADS           THREADS raw threads of ~1 ms of CPU, 8 at a time, each
 *       ending with the exit system call; then, after 0.3 s of sleep and 50 ms of CPU, prints
 *       "threads N", "timers N" (POSIX timers
 *       the process holds), "perf_fds N" (perf event descriptors) and "sigqueue_ok N/100 received N" (each timer leaked would hold
 *       a slot of RLIMIT_SIGPENDING). */
#define _GNU_SOURCE
#include <dirent.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define STACK (256 * 1024)
#define MAX_THREADS 64
#define FLAGS (CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM | CLONE_CHILD_CLEARTID)

static char stacks[MAX_THREADS][STACK] __attribute__((aligned(64)));
/* Set to the thread id by clone, cleared and futex-woken by the kernel at the thread's end. */
static volatile pid_t alive[MAX_THREADS];
static volatile unsigned long sink;
static volatile sig_atomic_t received;
static int links, link_ms, chains;
static volatile int links_run;

static long thread_cpu_ns(void) {
  struct timespec ts;
  syscall(SYS_clock_gettime, CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void burn_for(long ns) __attribute__((noinline));
static void burn_for(long ns) {
  long end = thread_cpu_ns() + ns;
  while (thread_cpu_ns() < end)
    for (int i = 0; i < 20000; i++) sink = sink * 31 + i;
}

static int start(int slot, int (*fn)(void *), long arg) {
  return clone(fn, stacks[slot] + STACK, FLAGS | CLONE_PARENT_SETTID, (void *)arg, &alive[slot], NULL, &alive[slot]);
}

/* Waits for the thread in `slot` to end (CLONE_CHILD_CLEARTID clears the word and wakes it). */
static void join(int slot) {
  pid_t tid;
  while ((tid = alive[slot]) != 0) syscall(SYS_futex, &alive[slot], FUTEX_WAIT, tid, NULL, NULL, 0);
}

/* arg: chain * links + link. Each chain uses two stack slots in turn: the next link starts on
 * the other one while this one ends. */
static int raw_link(void *arg) __attribute__((noinline));
static int raw_link(void *arg) {
  long n = (long)arg;
  int chain = n / links, link = n % links;
  burn_for(link_ms * 1000000L);
  __atomic_add_fetch(&links_run, 1, __ATOMIC_SEQ_CST);
  if (link + 1 < links) {
    int next = 2 * chain + (link + 1) % 2;
    join(next); /* the link before this one, which used that slot, has ended */
    start(next, raw_link, n + 1);
  }
  return 0; /* the wrapper ends the thread with the exit system call */
}

static int short_life(void *arg) {
  (void)arg;
  burn_for(1000000);
  return 0;
}

static int count_lines(const char *path, const char *prefix) {
  FILE *f = fopen(path, "r");
  char line[256];
  int n = 0;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, prefix, strlen(prefix))) n++;
  if (f) fclose(f);
  return n;
}

/* Entries of directory `path`, or with `link_contains`, those whose link target contains it. */
static int count_dir(const char *path, const char *link_contains) {
  DIR *d = opendir(path);
  struct dirent *e;
  int n = 0;
  char p[512], target[256];
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    if (!link_contains) {
      n++;
      continue;
    }
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    ssize_t len = readlink(p, target, sizeof target - 1);
    if (len > 0) {
      target[len] = 0;
      n += strstr(target, link_contains) != NULL;
    }
  }
  if (d) closedir(d);
  return n;
}

/* On stderr, which the profiler writes to too: stdout stays the same profiled or not. */
static void print_cpu(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  fprintf(stderr, "cpu %.3f\n", ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
}

static void on_usr(int sig) {
  (void)sig;
  received++;
}

int main(int argc, char **argv) {
  if (argc >= 5 && !strcmp(argv[1], "relay")) {
    chains = atoi(argv[2]), links = atoi(argv[3]), link_ms = atoi(argv[4]);
    if (chains < 1 || 2 * chains > MAX_THREADS || links < 1) return 2;
    usleep(2500000);
    for (int c = 0; c < chains; c++) start(2 * c, raw_link, (long)c * links);
    burn_for((long)links * link_ms * 1000000L);
    while (__atomic_load_n(&links_run, __ATOMIC_SEQ_CST) < chains * links) usleep(1000);
    for (int s = 0; s < 2 * chains; s++) join(s);
    printf("links %d\n", links_run);
    fflush(stdout);
    print_cpu();
    return 0;
  }
  if (argc >= 4 && !strcmp(argv[1], "sparse")) {
    int rounds = atoi(argv[2]);
    links = 1, link_ms = atoi(argv[3]);
    for (int r = 0; r < rounds; r++) {
      usleep(3000000);
      start(0, raw_link, 0);
      join(0);
      burn_for(link_ms * 1000000L);
    }
    printf("rounds %d\n", links_run);
    fflush(stdout);
    print_cpu();
    return 0;
  }
  if (argc >= 3 && !strcmp(argv[1], "churn")) {
    int total = atoi(argv[2]);
    for (int done = 0; done < total; done += 8) {
      for (int i = 0; i < 8; i++) start(i, short_life, 0);
      for (int i = 0; i < 8; i++) join(i);
    }
    /* Let the profiler notice the threads have ended: its writer, within a tick; in a process
     * that has no writer (it never called pthread_create), the signal handler, at the next
     * sample of a thread that runs, as in any process that goes on. */
    usleep(300000);
    burn_for(50 * 1000 * 1000);
    printf("threads %d\ntimers %d\nperf_fds %d\n", count_dir("/proc/self/task", NULL),
           count_lines("/proc/self/timers", "ID:"), count_dir("/proc/self/fd", "perf_event"));
    signal(SIGRTMIN + 1, on_usr);
    int ok = 0;
    union sigval v = {.sival_int = 7};
    for (int i = 0; i < 100; i++) ok += sigqueue(getpid(), SIGRTMIN + 1, v) == 0;
    printf("sigqueue_ok %d/100 received %d\n", ok, (int)received);
    return 0;
  }
  fprintf(stderr, "usage: raw_clone relay CHAINS LINKS MS | sparse ROUNDS MS | churn THREADS\n");
  return 2;
}
