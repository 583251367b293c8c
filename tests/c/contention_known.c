/* Known answers for contention profiles (tests/contention.rs): threads that wait for each
 * other, each timing its own waits.
 *
 *   contention_known mutex T SECONDS HOLD_US   T threads take one pthread mutex in turn (in
 *                                              take_mutex, given back in release_mutex), each
 *                                              holding it HOLD_US asleep, for SECONDS; prints
 *                                              `waited_ns N` (the time all threads spent in
 *                                              pthread_mutex_lock), `waits N` (calls that
 *                                              waited over 1 us) and `handoff_ns N` (of the
 *                                              waits, the time from a release to the return).
 *   contention_known rwlock T SECONDS HOLD_US  the same with a reader-writer lock taken for
 *                                              writing (take_rwlock, release_rwlock).
 *   contention_known sem T SECONDS HOLD_US     the same with a semaphore of one (take_sem,
 *                                              release_sem).
 *   contention_known uncontended N [waiter]    N lock/unlock pairs of one thread; prints
 *                                              `ns_per_pair X` (for the overhead benchmark);
 *                                              with `waiter`, while another thread waits for
 *                                              another mutex all along (a wait the holders'
 *                                              view tracks: every release looks it up).
 *   contention_known semantics                 the answers the interposed calls must keep:
 *                                              relocking an error-checking mutex (EDEADLK),
 *                                              timed locks and waits past their deadline
 *                                              (ETIMEDOUT, errno), a recursive mutex, a
 *                                              reader-writer lock held for reading twice.
 *   contention_known procs SECONDS HOLD_US     two single-threaded processes (forked) taking a
 *                                              process-shared semaphore in turn (in
 *                                              take_shared_sem), each holding it HOLD_US
 *                                              asleep; the child dies with the parent.
 *   contention_known closefds                  `mutex 2 0.5 1000`, then closes every descriptor
 *                                              above 2 (as Chromium's zygote does) and ends
 *                                              with _exit.
 *   contention_known cancel                    a thread cancelled inside sem_wait, then, 0.3 s
 *                                              later, the semaphore posted (in
 *                                              post_after_cancel); prints `cancelled 1` if the
 *                                              thread ended cancelled, its cleanup run.
 *   contention_known fork SECONDS HOLD_US      `mutex 2 SECONDS HOLD_US` in a forked child,
 *                                              then in the parent.
 *   contention_known drop SECONDS HOLD_US      as `fork`, but the child becomes nobody
 *                                              (uid and gid 65534) first and ends with _exit.
 *   contention_known api FILE                  (built with -DUSE_API -lcpuprof) `mutex 4 1
 *                                              1000` between CpuprofStartContention(FILE) and
 *                                              CpuprofStopContention().
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef USE_API
#include <cpuprof.h>
#endif

static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_rwlock_t rwlock = PTHREAD_RWLOCK_INITIALIZER;
static sem_t sem;
static double seconds;
static long hold_us;
static const char *mode;

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

struct waits {
  long long waited_ns;
  long waits;
  /* Of waited_ns, the time from the lock's release to the waiter's return: the hand-off,
   * which the holder's view charges to no holder. */
  long long handoff_ns;
};

/* When the lock (mutex, rwlock or semaphore) was last given back. */
static long long released_at;

static void count_wait(struct waits *w, long long start) {
  long long acquired = now_ns(), waited = acquired - start;
  w->waited_ns += waited;
  w->waits += waited > 1000;
  long long handoff = acquired - __atomic_load_n(&released_at, __ATOMIC_RELAXED);
  if (waited > 1000 && handoff > 0 && handoff < waited) w->handoff_ns += handoff;
}

/* Each takes its lock, timing the wait. */
__attribute__((noinline)) static void take_mutex(struct waits *w) {
  long long start = now_ns();
  pthread_mutex_lock(&mutex);
  count_wait(w, start);
}

__attribute__((noinline)) static void take_rwlock(struct waits *w) {
  long long start = now_ns();
  pthread_rwlock_wrlock(&rwlock);
  count_wait(w, start);
}

__attribute__((noinline)) static void take_sem(struct waits *w) {
  long long start = now_ns();
  while (sem_wait(&sem) != 0) {
  }
  count_wait(w, start);
}

/* Each gives its lock back: the holders' chains (the holder's view). */
__attribute__((noinline)) static void release_mutex(void) {
  __atomic_store_n(&released_at, now_ns(), __ATOMIC_RELAXED);
  pthread_mutex_unlock(&mutex);
  __asm__ volatile("" ::: "memory"); /* not a tail call: this frame stays on the chain */
}

__attribute__((noinline)) static void release_rwlock(void) {
  __atomic_store_n(&released_at, now_ns(), __ATOMIC_RELAXED);
  pthread_rwlock_unlock(&rwlock);
  __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static void release_sem(void) {
  __atomic_store_n(&released_at, now_ns(), __ATOMIC_RELAXED);
  sem_post(&sem);
  __asm__ volatile("" ::: "memory");
}

static void *worker(void *arg) {
  struct waits *w = arg;
  long long end = now_ns() + (long long)(seconds * 1e9);
  while (now_ns() < end) {
    if (strcmp(mode, "mutex") == 0) {
      take_mutex(w);
      usleep(hold_us);
      release_mutex();
    } else if (strcmp(mode, "rwlock") == 0) {
      take_rwlock(w);
      usleep(hold_us);
      release_rwlock();
    } else {
      take_sem(w);
      usleep(hold_us);
      release_sem();
    }
  }
  return NULL;
}

struct deadline_lock {
  pthread_mutex_t *mutex;
  struct timespec deadline;
  int result;
};

static void *lock_by(void *arg) {
  struct deadline_lock *d = arg;
  d->result = pthread_mutex_timedlock(d->mutex, &d->deadline);
  return NULL;
}

/* What the interposed calls answer where they must not differ from glibc's. */
static int semantics(void) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK);
  pthread_mutex_t checked;
  pthread_mutex_init(&checked, &attr);
  printf("errorcheck_lock %d\n", pthread_mutex_lock(&checked));
  printf("errorcheck_relock %s\n", pthread_mutex_lock(&checked) == EDEADLK ? "EDEADLK" : "other");
  struct timespec past;
  clock_gettime(CLOCK_REALTIME, &past);
  past.tv_sec -= 1;
  pthread_mutex_unlock(&checked);
  pthread_mutex_lock(&mutex);
  /* Held here: another thread's timed lock must time out. */
  struct deadline_lock d = {&mutex, {0, 0}, -1};
  clock_gettime(CLOCK_REALTIME, &d.deadline);
  d.deadline.tv_nsec += 20000000;
  if (d.deadline.tv_nsec >= 1000000000) {
    d.deadline.tv_sec++;
    d.deadline.tv_nsec -= 1000000000;
  }
  pthread_t other;
  pthread_create(&other, NULL, lock_by, &d);
  pthread_join(other, NULL);
  printf("timedlock_held %s\n", d.result == ETIMEDOUT ? "ETIMEDOUT" : "other");
  pthread_mutex_unlock(&mutex);
  pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_t recursive;
  pthread_mutex_init(&recursive, &attr);
  int r1 = pthread_mutex_lock(&recursive), r2 = pthread_mutex_lock(&recursive);
  printf("recursive %d %d\n", r1, r2);
  pthread_mutex_unlock(&recursive);
  pthread_mutex_unlock(&recursive);
  int rd1 = pthread_rwlock_rdlock(&rwlock), rd2 = pthread_rwlock_rdlock(&rwlock);
  printf("rwlock_read_twice %d %d\n", rd1, rd2);
  pthread_rwlock_unlock(&rwlock);
  pthread_rwlock_unlock(&rwlock);
  sem_t empty;
  sem_init(&empty, 0, 0);
  errno = 0;
  int waited = sem_timedwait(&empty, &past);
  printf("sem_timedwait %d %s\n", waited, errno == ETIMEDOUT ? "ETIMEDOUT" : "other");
  errno = 0;
  int tried = sem_trywait(&empty);
  printf("sem_trywait %d %s\n", tried, errno == EAGAIN ? "EAGAIN" : "other");
  return 0;
}

static int cleaned_up;

static void clean_up(void *arg) {
  (void)arg;
  cleaned_up = 1;
}

static void *wait_until_cancelled(void *arg) {
  pthread_cleanup_push(clean_up, NULL);
  while (sem_wait(arg) != 0) {
  }
  pthread_cleanup_pop(0);
  return NULL;
}

__attribute__((noinline)) static void post_after_cancel(sem_t *s) {
  sem_post(s);
  __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static void take_shared_sem(sem_t *s, struct waits *w) {
  long long start = now_ns();
  while (sem_wait(s) != 0) {
  }
  count_wait(w, start);
}

/* Two single-threaded processes waiting for each other (a prefork server's workers). */
static int procs(double secs, long hold) {
  sem_t *shared = mmap(NULL, sizeof(sem_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED || sem_init(shared, 1, 1) != 0) return 1;
  pid_t child = fork();
  if (child == 0) prctl(PR_SET_PDEATHSIG, SIGKILL);
  struct waits w = {0, 0, 0};
  long long end = now_ns() + (long long)(secs * 1e9);
  while (now_ns() < end) {
    take_shared_sem(shared, &w);
    usleep(hold);
    sem_post(shared);
  }
  if (child == 0) _exit(0);
  waitpid(child, NULL, 0);
  printf("waited_ns %lld\n", w.waited_ns);
  return 0;
}

/* A wait left by cancellation: no one waits when the semaphore is posted later. */
static int cancel(void) {
  sem_t never;
  sem_init(&never, 0, 0);
  pthread_t t;
  pthread_create(&t, NULL, wait_until_cancelled, &never);
  usleep(100000);
  pthread_cancel(t);
  void *result;
  pthread_join(t, &result);
  usleep(300000);
  post_after_cancel(&never);
  printf("cancelled %d\n", result == PTHREAD_CANCELED && cleaned_up);
  return 0;
}

static pthread_mutex_t other = PTHREAD_MUTEX_INITIALIZER;

static void *wait_for_other(void *arg) {
  (void)arg;
  pthread_mutex_lock(&other);
  pthread_mutex_unlock(&other);
  return NULL;
}

int main(int argc, char **argv) {
  if ((argc == 3 || (argc == 4 && strcmp(argv[3], "waiter") == 0)) && strcmp(argv[1], "uncontended") == 0) {
    long n = atol(argv[2]);
    pthread_t waiter;
    if (argc == 4) {
      pthread_mutex_lock(&other);
      pthread_create(&waiter, NULL, wait_for_other, NULL);
      usleep(20000); /* in its wait */
    }
    long long start = now_ns();
    for (long i = 0; i < n; i++) {
      pthread_mutex_lock(&mutex);
      pthread_mutex_unlock(&mutex);
    }
    printf("ns_per_pair %.2f\n", (double)(now_ns() - start) / n);
    if (argc == 4) {
      pthread_mutex_unlock(&other);
      pthread_join(waiter, NULL);
    }
    return 0;
  }
  if (argc == 2 && strcmp(argv[1], "semantics") == 0) return semantics();
  if (argc == 2 && strcmp(argv[1], "cancel") == 0) return cancel();
  if (argc == 2 && strcmp(argv[1], "closefds") == 0) {
    char *args[] = {argv[0], "mutex", "2", "0.5", "1000", NULL};
    int status = main(5, args);
    fflush(stdout);
    /* All of them, wherever they sit (cpuprof keeps its own high). */
    syscall(SYS_close_range, 3, ~0U, 0);
    _exit(status);
  }
  if (argc == 4 && strcmp(argv[1], "procs") == 0) return procs(atof(argv[2]), atol(argv[3]));
#ifdef USE_API
  if (argc == 3 && strcmp(argv[1], "api") == 0) {
    char *args[] = {argv[0], "mutex", "4", "1", "1000", NULL};
    if (!CpuprofStartContention(argv[2], 0)) return 1;
    int status = main(5, args);
    return status | !CpuprofStopContention();
  }
#endif
  if (argc == 4 && (strcmp(argv[1], "fork") == 0 || strcmp(argv[1], "drop") == 0)) {
    char *args[] = {argv[0], "mutex", "2", argv[2], argv[3], NULL};
    pid_t child = fork();
    if (child == 0 && strcmp(argv[1], "drop") == 0) {
      if (setgid(65534) != 0 || setuid(65534) != 0) {
        perror("setuid");
        _exit(3);
      }
      int status = main(5, args);
      fflush(stdout);
      _exit(status);
    }
    if (child == 0) return main(5, args);
    int status;
    waitpid(child, &status, 0);
    return main(5, args) | (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
  }
  if (argc != 5) {
    fprintf(stderr, "usage: contention_known mutex|rwlock|sem T SECONDS HOLD_US | uncontended N | semantics | fork|drop SECONDS HOLD_US\n");
    return 2;
  }
  mode = argv[1];
  int threads = atoi(argv[2]);
  seconds = atof(argv[3]);
  hold_us = atol(argv[4]);
  if (threads < 1 || threads > 64) return 2;
  sem_init(&sem, 0, 1);
  pthread_t t[64];
  struct waits w[64];
  memset(w, 0, sizeof w);
  for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, &w[i]);
  long long waited = 0, handoff = 0;
  long waits = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(t[i], NULL);
    waited += w[i].waited_ns;
    waits += w[i].waits;
    handoff += w[i].handoff_ns;
  }
  printf("waited_ns %lld\nwaits %ld\nhandoff_ns %lld\n", waited, waits, handoff);
  return 0;
}
