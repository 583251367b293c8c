/* Writes a heap profile of its own allocations in gperftools' text format (heap_v2), with
 * real addresses, for cli/tests/heap_cli.rs.
 *
 *   heap_cli OUT BIG_INUSE SMALL_INUSE BIG_ALLOC SMALL_ALLOC
 *
 * grow_big and grow_small each allocate through tracked_malloc, which notes where it was
 * called from as tcmalloc's heap profiler does: the return address into its caller (the
 * allocating call), then the return address into main. OUT then gets one line per function
 * with the given counts of sampled objects (1024 bytes each), in use and allocated in all,
 * at a sampling period of 512 KiB, and this process's /proc/self/maps. Build with
 * -O0 -fno-omit-frame-pointer (__builtin_return_address(1) walks the frame pointer).
 */
#include <stdio.h>
#include <stdlib.h>

#define OBJECT 1024
#define PERIOD 524288

struct site {
    void *call;   /* return address into the allocating function */
    void *caller; /* return address into main */
};

static struct site big, small;

__attribute__((noinline)) static void *tracked_malloc(size_t n, struct site *s) {
    s->call = __builtin_return_address(0);
    s->caller = __builtin_return_address(1);
    return malloc(n);
}

__attribute__((noinline)) void *grow_big(void) {
    return tracked_malloc(OBJECT, &big);
}

__attribute__((noinline)) void *grow_small(void) {
    return tracked_malloc(OBJECT, &small);
}

static void line(FILE *out, unsigned long inuse, unsigned long alloc, const struct site *s) {
    fprintf(out, "%6lu: %8lu [%6lu: %8lu] @ %p %p\n", inuse, inuse * OBJECT, alloc, alloc * OBJECT,
            s->call, s->caller);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s OUT BIG_INUSE SMALL_INUSE BIG_ALLOC SMALL_ALLOC\n", argv[0]);
        return 2;
    }
    unsigned long n[4];
    for (int i = 0; i < 4; i++) n[i] = strtoul(argv[2 + i], NULL, 10);
    void *a = grow_big();
    void *b = grow_small();
    FILE *out = fopen(argv[1], "w");
    if (!out) {
        perror(argv[1]);
        return 1;
    }
    unsigned long inuse = n[0] + n[1], alloc = n[2] + n[3];
    fprintf(out, "heap profile: %6lu: %8lu [%6lu: %8lu] @ heap_v2/%d\n", inuse, inuse * OBJECT, alloc,
            alloc * OBJECT, PERIOD);
    line(out, n[0], n[2], &big);
    line(out, n[1], n[3], &small);
    fputs("\nMAPPED_LIBRARIES:\n", out);
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps) {
        perror("/proc/self/maps");
        return 1;
    }
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, maps)) > 0) fwrite(buf, 1, got, out);
    fclose(maps);
    free(a);
    free(b);
    return fclose(out) == 0 ? 0 : 1;
}
