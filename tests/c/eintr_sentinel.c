/* EINTR sentinel: threads blocked in nanosleep, epoll_wait, poll, select, read on a pipe,
 * accept (socket with a receive timeout, so not restarted), a futex wait (timed and untimed,
 * raw system calls) and sem_timedwait, each call checked: abort() on EINTR or on a return
 * before its timeout; and threads that block every signal while they run and allow them all
 * in ppoll, pselect and epoll_pwait, or wait for all of them with sigtimedwait. Half the threads also burn a little CPU between calls, so per-thread
 * CPU timers expire around their system calls. Runs SECONDS (argv[1], default 10).
 * With SENTINEL_SELF_TEST=1 the program signals its own blocked threads (SA_RESTART handler):
 * it must then abort, which shows the checks can fail. Output: one line per kind of call. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define TIMEOUT_MS 40
static double seconds = 10.0, start;
static int pipe_fds[2], listener, port;
static sem_t sem;
static unsigned futex_word;
static volatile unsigned long sink;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static int running(void) { return now() - start < seconds; }
static void fail(const char *what, int rc, int err, double took) {
    fprintf(stderr, "%s: rc %d errno %d (%s) after %.3f ms\n", what, rc, err, strerror(err), took * 1e3);
    abort();
}
/* A call that must last its timeout: EINTR or an early return aborts. */
static void check(const char *what, int rc, int want, double t0) {
    int err = errno;
    double took = now() - t0;
    if (rc != want || took < TIMEOUT_MS * 1e-3 - 1e-3) fail(what, rc, err, took);
}
static void spin(long id) {
    if (id & 1) {
        unsigned long x = id;
        for (int i = 0; i < 1000000; i++) x = x * 6364136223846793005UL + 1;
        sink = x;
    }
}
static struct timespec rel(void) { return (struct timespec){0, TIMEOUT_MS * 1000000L}; }
static struct timespec abs_deadline(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    t.tv_nsec += TIMEOUT_MS * 1000000L;
    if (t.tv_nsec >= 1000000000L) { t.tv_sec++; t.tv_nsec -= 1000000000L; }
    return t;
}

static void *sleeper(void *arg) {
    for (long id = (long)arg; running(); spin(id)) {
        struct timespec t = rel();
        double t0 = now();
        check("nanosleep", nanosleep(&t, NULL), 0, t0);
    }
    return NULL;
}
static void *epoller(void *arg) {
    int ep = epoll_create1(0);
    for (long id = (long)arg; running(); spin(id)) {
        struct epoll_event ev;
        double t0 = now();
        check("epoll_wait", epoll_wait(ep, &ev, 1, TIMEOUT_MS), 0, t0);
    }
    close(ep);
    return NULL;
}
static void *poller(void *arg) {
    for (long id = (long)arg; running(); spin(id)) {
        double t0 = now();
        check("poll", poll(NULL, 0, TIMEOUT_MS), 0, t0);
    }
    return NULL;
}
static void *selector(void *arg) {
    for (long id = (long)arg; running(); spin(id)) {
        struct timeval tv = {0, TIMEOUT_MS * 1000};
        double t0 = now();
        check("select", select(0, NULL, NULL, NULL, &tv), 0, t0);
    }
    return NULL;
}
static void *futex_timed(void *arg) {
    for (long id = (long)arg; running(); spin(id)) {
        struct timespec t = rel();
        double t0 = now();
        int rc = syscall(SYS_futex, &futex_word, FUTEX_WAIT_PRIVATE, 0, &t, NULL, 0);
        check("futex timed", rc == -1 && errno == ETIMEDOUT ? 0 : rc, 0, t0);
    }
    return NULL;
}
static void *sem_waiter(void *arg) {
    for (long id = (long)arg; running(); spin(id)) {
        struct timespec t = abs_deadline(CLOCK_REALTIME);
        double t0 = now();
        int rc = sem_timedwait(&sem, &t);
        check("sem_timedwait", rc == -1 && errno == ETIMEDOUT ? 0 : rc, 0, t0);
    }
    return NULL;
}
/* Blocks every signal while it runs and allows them all in its waits (the pselect pattern):
 * a profiling signal left pending while it ran must not interrupt the wait. Always spins. */
static void *masked_waiter(void *arg) {
    long kind = (long)arg;
    sigset_t all, none;
    sigfillset(&all);
    sigemptyset(&none);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    int ep = epoll_create1(0);
    while (running()) {
        spin(1);
        struct timespec t = rel();
        struct epoll_event ev;
        double t0 = now();
        if (kind == 0) check("ppoll (signals blocked while running)", ppoll(NULL, 0, &t, &none), 0, t0);
        if (kind == 1) check("pselect (signals blocked while running)", pselect(0, NULL, NULL, NULL, &t, &none), 0, t0);
        if (kind == 2) check("epoll_pwait (signals blocked while running)", epoll_pwait(ep, &ev, 1, TIMEOUT_MS, &none), 0, t0);
        if (kind == 3) {
            /* Waits for any signal: none is sent, so it must time out. */
            int sig = sigtimedwait(&all, NULL, &t);
            check("sigtimedwait for every signal", sig == -1 && errno == EAGAIN ? 0 : sig, 0, t0);
        }
    }
    close(ep);
    return NULL;
}
static void *acceptor(void *arg) {
    (void)arg;
    for (;;) {
        double t0 = now();
        int c = accept(listener, NULL, NULL);
        if (c >= 0) { close(c); return NULL; } /* main's connection at the end */
        if (errno != EAGAIN) fail("accept", c, errno, now() - t0);
        check("accept", 0, 0, t0);
    }
}
/* Untimed: returns only when main writes / wakes at the end. */
static void *reader(void *arg) {
    (void)arg;
    char c;
    ssize_t n = read(pipe_fds[0], &c, 1);
    if (n != 1) fail("read", (int)n, errno, now() - start);
    return NULL;
}
static void *futex_untimed(void *arg) {
    (void)arg;
    while (__atomic_load_n(&futex_word, __ATOMIC_SEQ_CST) == 0) {
        int rc = syscall(SYS_futex, &futex_word, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
        if (rc != 0 && errno != EAGAIN) fail("futex untimed", rc, errno, now() - start);
        if (rc == 0 && __atomic_load_n(&futex_word, __ATOMIC_SEQ_CST) == 0) fail("futex untimed woke early", rc, 0, now() - start);
    }
    return NULL;
}

static void on_signal(int sig) { (void)sig; }

int main(int argc, char **argv) {
    if (argc > 1) seconds = atof(argv[1]);
    start = now();
    if (pipe(pipe_fds) != 0 || sem_init(&sem, 0, 0) != 0) return 1;
    listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    struct timeval tv = {0, TIMEOUT_MS * 1000};
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) || listen(listener, 4) ||
        getsockname(listener, (struct sockaddr *)&addr, &len) ||
        setsockopt(listener, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv))
        return 1;
    port = ntohs(addr.sin_port);
    void *(*kinds[])(void *) = {sleeper, epoller, poller, selector, futex_timed, sem_waiter};
    const char *names[] = {"nanosleep", "epoll_wait", "poll", "select", "futex timed", "sem_timedwait"};
    pthread_t masked[4];
    for (long k = 0; k < 4; k++) pthread_create(&masked[k], NULL, masked_waiter, (void *)k);
    enum { KINDS = sizeof kinds / sizeof kinds[0], EACH = 2 };
    pthread_t threads[KINDS * EACH], acc, rd, fu;
    for (int k = 0; k < KINDS; k++)
        for (int i = 0; i < EACH; i++) pthread_create(&threads[k * EACH + i], NULL, kinds[k], (void *)(long)i);
    pthread_create(&acc, NULL, acceptor, NULL);
    pthread_create(&rd, NULL, reader, NULL);
    pthread_create(&fu, NULL, futex_untimed, NULL);
    if (getenv("SENTINEL_SELF_TEST")) {
        struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
        sigaction(SIGUSR1, &sa, NULL);
        usleep(100000);
        for (int i = 0; i < KINDS * EACH; i++) pthread_kill(threads[i], SIGUSR1);
    }
    for (int i = 0; i < KINDS * EACH; i++) pthread_join(threads[i], NULL);
    for (int k = 0; k < 4; k++) pthread_join(masked[k], NULL);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&addr, sizeof addr) != 0) return 1;
    pthread_join(acc, NULL);
    close(c);
    if (write(pipe_fds[1], "x", 1) != 1) return 1;
    pthread_join(rd, NULL);
    __atomic_store_n(&futex_word, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &futex_word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    pthread_join(fu, NULL);
    for (int k = 0; k < KINDS; k++) printf("%s ok\n", names[k]);
    puts("ppoll, pselect, epoll_pwait, sigtimedwait with signals blocked while running ok");
    puts("accept ok\nread ok\nfutex untimed ok");
    return 0;
}
