/* The bundled demo: a small batch job with a few distinct hot spots, for a first look at
 * cpuprof (see README.md). Run it under the profiler with examples/demo.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 200000

__attribute__((noinline)) static int count_primes(int limit) {
  char *composite = calloc(limit + 1, 1);
  int count = 0;
  for (int i = 2; i <= limit; i++) {
    if (composite[i]) continue;
    count++;
    for (long j = (long)i * i; j <= limit; j += i) composite[j] = 1;
  }
  free(composite);
  return count;
}

static int compare(const void *a, const void *b) {
  unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
  return (x > y) - (x < y);
}

__attribute__((noinline)) static unsigned sort_numbers(unsigned seed) {
  static unsigned values[N];
  for (int i = 0; i < N; i++) values[i] = seed = seed * 1103515245u + 12345u;
  qsort(values, N, sizeof values[0], compare);
  return values[N / 2];
}

__attribute__((noinline)) static unsigned long hash_strings(int rounds) {
  char text[64];
  unsigned long h = 1469598103934665603UL;
  for (int r = 0; r < rounds; r++) {
    snprintf(text, sizeof text, "record-%d-%d", r, r * 7);
    for (size_t i = 0; i < strlen(text); i++) h = (h ^ (unsigned char)text[i]) * 1099511628211UL;
  }
  return h;
}

int main(void) {
  unsigned long result = 0;
  for (int round = 0; round < 6; round++) {
    result += count_primes(20000000);
    result += sort_numbers(round + 1);
    result += hash_strings(1500000);
  }
  printf("demo result %lu\n", result);
  return 0;
}
