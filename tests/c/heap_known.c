/* Heap profile known answer: big_a allocates 3 bytes for every byte big_b allocates, in
 * sizes from 16 B to 1 MiB (the same sequence of sizes, a's three times over); half of
 * big_b's blocks are freed, none of big_a's. Prints the truth:
 *   alloc a=<bytes> b=<bytes> inuse a=<bytes> b=<bytes>
 * Arguments: the number of rounds (default 40); `serve`: then wait until stdin closes, the
 * blocks still held (for the HTTP endpoint's heap profiles); `pause`: 50 ms after each round. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_BLOCKS 200000
static void *kept[MAX_BLOCKS];
static int nkept;
static unsigned long long alloc_a, alloc_b, inuse_a, inuse_b;

static size_t size_at(unsigned i) {
  /* 16 B .. 1 MiB, many small and few large: the shape of real programs. */
  static const size_t sizes[] = {16, 24, 40, 64, 100, 256, 512, 1000, 4096, 10000, 65536, 300000, 1 << 20};
  unsigned k = (i * 7919u) % 64u;
  if (k < 30) return sizes[k % 5];
  if (k < 50) return sizes[5 + k % 4];
  if (k < 60) return sizes[9 + k % 2];
  return sizes[11 + k % 2];
}

static void keep(void *p) {
  if (nkept < MAX_BLOCKS) kept[nkept++] = p;
}

__attribute__((noinline)) void *big_a(size_t n) {
  void *p = malloc(n);
  memset(p, 1, n < 64 ? n : 64);
  __asm__ volatile("" ::: "memory");
  return p;
}

__attribute__((noinline)) void *big_b(size_t n) {
  void *p = malloc(n);
  memset(p, 2, n < 64 ? n : 64);
  __asm__ volatile("" ::: "memory");
  return p;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 40;
  int pause = argc > 2 && strcmp(argv[2], "pause") == 0;
  unsigned i = 0;
  for (int r = 0; r < rounds; r++) {
    for (unsigned j = 0; j < 1000; j++, i++) {
      size_t n = size_at(i);
      for (int t = 0; t < 3; t++) {
        keep(big_a(n));
        alloc_a += n;
        inuse_a += n;
      }
      void *b = big_b(n);
      alloc_b += n;
      if (i % 2 == 0) {
        free(b);
      } else {
        keep(b);
        inuse_b += n;
      }
    }
    if (pause) usleep(50000);
  }
  printf("alloc a=%llu b=%llu inuse a=%llu b=%llu\n", alloc_a, alloc_b, inuse_a, inuse_b);
  fflush(stdout);
  if (argc > 2 && strcmp(argv[2], "serve") == 0) {
    char buf[64];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {
    }
  }
  return 0;
}
