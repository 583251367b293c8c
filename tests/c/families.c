/* Known-answer workload for `cpuprof advise`: churn() spends its time allocating, zeroing and
 * freeing blocks (malloc/memset/free), so the allocation and copying-and-zeroing families must
 * be named with churn as their caller in the program.
 *
 *   families SECONDS     churn for SECONDS of CPU; prints "checksum N" (of the first round) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static unsigned long churn(unsigned long rounds) {
  unsigned long sum = 0;
  void *keep[64] = {0};
  for (unsigned long r = 0; r < rounds; r++) {
    size_t size = 16 + (r * 2654435761u) % 8192;
    unsigned char *p = malloc(size);
    if (!p) abort();
    memset(p, (int)r, size);
    sum += p[size / 2];
    /* Hold some blocks a while, so the allocator has work beyond its fast path. */
    free(keep[r % 64]);
    keep[r % 64] = p;
  }
  for (int i = 0; i < 64; i++) free(keep[i]);
  return sum;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 1.0;
  double end = cpu_seconds() + seconds;
  /* The checksum of one round: the same however many rounds the time allows. */
  unsigned long first = churn(20000);
  while (cpu_seconds() < end) churn(20000);
  printf("checksum %lu\n", first);
  return 0;
}
