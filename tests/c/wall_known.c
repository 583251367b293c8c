/* Known answer for wall-clock profiling: for SECONDS (default 2) of wall time, thread A burns
 * CPU in burn(), thread B is blocked in read() on a pipe under wait_for_input(), thread C in
 * pthread_cond_timedwait() under wait_for_work(). Each function should get SECONDS of wall
 * samples. Prints what each thread saw, which must be the same with and without profiler.
 *
 *   wall_known [SECONDS [crowded]]
 *
 * crowded: the process is bound to one CPU, where a fourth thread, R, burns in rival_burn()
 * for the same time: A and R share the CPU, each on it about half the time and runnable
 * (waiting for it) the other half, yet each function still spans SECONDS of wall time. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double seconds = 2.0;
static int pipe_fds[2];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static volatile unsigned long sink;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((noinline)) static void burn(double until) {
    unsigned long x = 1;
    while (now() < until)
        for (int i = 0; i < 10000; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
    sink = x;
}

static void *thread_a(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "burner");
    burn(now() + seconds);
    struct timespec cpu;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
    /* On stderr: it varies from run to run; a wall profile counts thread A's time on the CPU. */
    fprintf(stderr, "a_cpu %.3f\n", cpu.tv_sec + cpu.tv_nsec * 1e-9);
    return "a burnt";
}

__attribute__((noinline)) static void rival_burn(double until) {
    unsigned long x = 3;
    while (now() < until)
        for (int i = 0; i < 10000; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
    sink = x;
}

static double rival_until;

static void *thread_r(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "rival");
    rival_burn(rival_until);
    return "r burnt";
}

/* Blocks in read() until main writes, SECONDS after the start. */
__attribute__((noinline)) static char wait_for_input(void) {
    char c = 0;
    ssize_t n;
    do n = read(pipe_fds[0], &c, 1); while (n < 0 && errno == EINTR && getenv("WALL_RETRY_EINTR"));
    if (n != 1) { fprintf(stderr, "read returned %zd (%d)\n", n, errno); abort(); }
    return c;
}

static void *thread_b(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "reader");
    static char said[] = "b read ?";
    said[7] = wait_for_input();
    return said;
}

/* Waits on a condition nobody signals until its deadline, SECONDS from now. */
__attribute__((noinline)) static int wait_for_work(void) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    long ns = (long)(seconds * 1e9);
    deadline.tv_sec += ns / 1000000000L;
    deadline.tv_nsec += ns % 1000000000L;
    if (deadline.tv_nsec >= 1000000000L) { deadline.tv_sec++; deadline.tv_nsec -= 1000000000L; }
    pthread_mutex_lock(&lock);
    int rc = 0;
    while (rc == 0) rc = pthread_cond_timedwait(&cond, &lock, &deadline);
    pthread_mutex_unlock(&lock);
    return rc;
}

static void *thread_c(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "waiter");
    return wait_for_work() == ETIMEDOUT ? "c waited until its deadline" : "c was woken";
}

int main(int argc, char **argv) {
    if (argc > 1) seconds = atof(argv[1]);
    int crowded = argc > 2 && strcmp(argv[2], "crowded") == 0;
    if (crowded) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(sched_getcpu(), &one);
        if (sched_setaffinity(0, sizeof one, &one) != 0) return 1;
    }
    if (pipe(pipe_fds) != 0) return 1;
    pthread_t a, b, c, r;
    double start = now();
    rival_until = start + seconds;
    if (crowded) pthread_create(&r, NULL, thread_r, NULL);
    pthread_create(&a, NULL, thread_a, NULL);
    pthread_create(&b, NULL, thread_b, NULL);
    pthread_create(&c, NULL, thread_c, NULL);
    struct timespec t = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    while (nanosleep(&t, &t) != 0) {}
    if (write(pipe_fds[1], "x", 1) != 1) return 1;
    /* Printed in a fixed order once all are done: the output is compared between runs. */
    void *said;
    pthread_join(a, &said);
    puts(said);
    pthread_join(b, &said);
    puts(said);
    pthread_join(c, &said);
    puts(said);
    if (crowded) {
        pthread_join(r, &said);
        puts(said);
    }
    fflush(stdout);
    fprintf(stderr, "wall %.3f\n", now() - start);
    return 0;
}
