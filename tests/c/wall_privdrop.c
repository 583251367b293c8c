/* Known answer for wall-clock profiling across a privilege drop, as `memcached -u USER` does
 * it: started as root, the program starts one thread, drops to USER (setgroups, setgid,
 * setuid: it is then no longer dumpable, and its /proc/self/task/TID/syscall files are root's),
 * and starts its other threads. Every thread then blocks for SECONDS of wall time:
 *
 *   early    read() on a pipe, under wait_early()          (started before the drop)
 *   reader   read() on a pipe, under wait_in_read()        (after)
 *   sleeper  clock_nanosleep() for SECONDS, under wait_in_sleep()
 *   waiter   pthread_cond_wait(), under wait_in_cond()
 *
 * and main wakes them after SECONDS. Prints `dumpable N` after the drop and `blocked SECONDS`.
 *
 *   wall_privdrop USER SECONDS [late]
 *
 * late: the program starts the wall-clock profile itself after the drop (CpuprofStartWall,
 * found with dlsym, into $WALL_LATE_PROFILE) and stops it at the end: the profiler then
 * cannot read the blocked threads' state, and must say so. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <grp.h>
#include <pthread.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

static double seconds;
static int early_pipe[2], reader_pipe[2];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int woken;

static void check_read(ssize_t n) {
    if (n != 1) {
        fprintf(stderr, "read returned %zd (%s)\n", n, strerror(errno));
        abort();
    }
}

__attribute__((noinline)) static void wait_early(void) {
    char c;
    check_read(read(early_pipe[0], &c, 1));
}

__attribute__((noinline)) static void wait_in_read(void) {
    char c;
    check_read(read(reader_pipe[0], &c, 1));
}

__attribute__((noinline)) static void wait_in_sleep(void) {
    struct timespec t = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &t, &t) == EINTR) {
    }
}

__attribute__((noinline)) static void wait_in_cond(void) {
    pthread_mutex_lock(&lock);
    while (!woken) pthread_cond_wait(&cond, &lock);
    pthread_mutex_unlock(&lock);
}

static void *early(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "early");
    wait_early();
    return NULL;
}

static void *reader(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "reader");
    wait_in_read();
    return NULL;
}

static void *sleeper(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "sleeper");
    wait_in_sleep();
    return NULL;
}

static void *waiter(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "waiter");
    wait_in_cond();
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: wall_privdrop USER SECONDS [late]\n");
        return 2;
    }
    struct passwd *pw = getpwnam(argv[1]);
    if (!pw) {
        fprintf(stderr, "no user %s\n", argv[1]);
        return 2;
    }
    seconds = atof(argv[2]);
    int late = argc > 3 && strcmp(argv[3], "late") == 0;
    if (pipe(early_pipe) || pipe(reader_pipe)) return 1;
    pthread_t t[4];
    pthread_create(&t[0], NULL, early, NULL);
    usleep(50000);
    if (setgroups(0, NULL) || setgid(pw->pw_gid) || setuid(pw->pw_uid)) {
        perror("dropping privileges");
        return 1;
    }
    printf("dumpable %d\n", prctl(PR_GET_DUMPABLE));
    if (late) {
        int (*start)(const char *, int, const char *) = (int (*)(const char *, int, const char *))dlsym(RTLD_DEFAULT, "CpuprofStartWall");
        const char *path = getenv("WALL_LATE_PROFILE");
        if (!start || !path || !start(path, 100, NULL)) {
            fprintf(stderr, "cannot start the wall profile late\n");
            return 1;
        }
    }
    pthread_create(&t[1], NULL, reader, NULL);
    pthread_create(&t[2], NULL, sleeper, NULL);
    pthread_create(&t[3], NULL, waiter, NULL);
    struct timespec rest = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &rest, &rest) == EINTR) {
    }
    if (write(early_pipe[1], "x", 1) != 1 || write(reader_pipe[1], "x", 1) != 1) return 1;
    pthread_mutex_lock(&lock);
    woken = 1;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    if (late) {
        void (*stop)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "ProfilerStop");
        stop();
    }
    printf("blocked %.1f\n", seconds);
    return 0;
}
