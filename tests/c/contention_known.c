/* Known answers for contention profiles (tests/contention.rs): threads that wait for each
 * other, each timing its own waits.
 *
 *   contention_known mutex T SECONDS HOLD_US   T threads take one pthread mutex in turn (in
 *                                              take_mutex), each holding it HOLD_US asleep,
 *                                              for SECONDS; prints `waited_ns N` (the time
 *                                              all threads spent in pthread_mutex_lock) and
 *                                              `waits N` (calls that waited over 1 us).
 *   contention_known rwlock T SECONDS HOLD_US  the same with a reader-writer lock taken for
 *                                              writing (take_rwlock).
 *   contention_known sem T SECONDS HOLD_US     the same with a semaphore of one (take_sem).
 *   contention_known uncontended N             N lock/unlock pairs of one thread; prints
 *                                              `ns_per_pair X` (for the overhead benchmark).
 *   contention_known semantics                 the answers the interposed calls must keep:
 *                                              relocking an error-checking mutex (EDEADLK),
 *                                              timed locks and waits past their deadline
 *                                              (ETIMEDOUT, errno), a recursive mutex, a
 *                                              reader-writer lock held for reading twice.
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
};

/* Each takes its lock, timing the wait. */
__attribute__((noinline)) static void take_mutex(struct waits *w) {
  long long start = now_ns();
  pthread_mutex_lock(&mutex);
  long long waited = now_ns() - start;
  w->waited_ns += waited;
  w->waits += waited > 1000;
}

__attribute__((noinline)) static void take_rwlock(struct waits *w) {
  long long start = now_ns();
  pthread_rwlock_wrlock(&rwlock);
  long long waited = now_ns() - start;
  w->waited_ns += waited;
  w->waits += waited > 1000;
}

__attribute__((noinline)) static void take_sem(struct waits *w) {
  long long start = now_ns();
  while (sem_wait(&sem) != 0) {
  }
  long long waited = now_ns() - start;
  w->waited_ns += waited;
  w->waits += waited > 1000;
}

static void *worker(void *arg) {
  struct waits *w = arg;
  long long end = now_ns() + (long long)(seconds * 1e9);
  while (now_ns() < end) {
    if (strcmp(mode, "mutex") == 0) {
      take_mutex(w);
      usleep(hold_us);
      pthread_mutex_unlock(&mutex);
    } else if (strcmp(mode, "rwlock") == 0) {
      take_rwlock(w);
      usleep(hold_us);
      pthread_rwlock_unlock(&rwlock);
    } else {
      take_sem(w);
      usleep(hold_us);
      sem_post(&sem);
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

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "uncontended") == 0) {
    long n = atol(argv[2]);
    long long start = now_ns();
    for (long i = 0; i < n; i++) {
      pthread_mutex_lock(&mutex);
      pthread_mutex_unlock(&mutex);
    }
    printf("ns_per_pair %.2f\n", (double)(now_ns() - start) / n);
    return 0;
  }
  if (argc == 2 && strcmp(argv[1], "semantics") == 0) return semantics();
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
  long long waited = 0;
  long waits = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(t[i], NULL);
    waited += w[i].waited_ns;
    waits += w[i].waits;
  }
  printf("waited_ns %lld\nwaits %ld\n", waited, waits);
  return 0;
}
