/* Wall-clock profiling through include/cpuprof.h: CpuprofStartWall(WALL, 100, CPU or NULL),
 * then for SECONDS a thread blocked in read() under wait_for_input() while main burns CPU in
 * burn(), then ProfilerStop. Each function spans SECONDS of wall time.
 *
 *   wall_api WALL_PROFILE [CPU_PROFILE] */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <gperftools/profiler.h>
#include <cpuprof.h>

static const double seconds = 1.5;
static int pipe_fds[2];
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

__attribute__((noinline)) static char wait_for_input(void) {
    char c = 0;
    return read(pipe_fds[0], &c, 1) == 1 ? c : '?';
}

static void *reader(void *arg) {
    (void)arg;
    static char said[] = "read ?";
    said[5] = wait_for_input();
    return said;
}

int main(int argc, char **argv) {
    if (argc < 2 || pipe(pipe_fds) != 0) return 2;
    if (!CpuprofStartWall(argv[1], 100, argc > 2 ? argv[2] : NULL)) return 3;
    pthread_t t;
    pthread_create(&t, NULL, reader, NULL);
    burn(now() + seconds);
    if (write(pipe_fds[1], "x", 1) != 1) return 1;
    void *said;
    pthread_join(t, &said);
    ProfilerStop();
    puts(said);
    return 0;
}
