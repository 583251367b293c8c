/* What a program thread allocates inside cpuprof is not the program's (tests/heap.rs): loads
 * LIBRARY with dlopen (the unwinder's snapshot of the loaded code goes stale), allocates 16
 * blocks of 4 KiB, then asks for a file with HeapProfilerDump (found with dlsym: the program
 * is not linked with cpuprof), whose writing refreshes that snapshot on this thread; twice.
 *
 *   heap_own_work LIBRARY */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) void *program_block(void) { return malloc(4096); }

int main(int argc, char **argv) {
  void (*dump)(const char *) = (void (*)(const char *))dlsym(RTLD_DEFAULT, "HeapProfilerDump");
  if (!dump || argc < 2) {
    fprintf(stderr, "no HeapProfilerDump or no LIBRARY\n");
    return 2;
  }
  static void *kept[32];
  for (int round = 0; round < 2; round++) {
    if (round == 0 && !dlopen(argv[1], RTLD_NOW)) {
      fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
      return 2;
    }
    for (int i = 0; i < 16; i++)
      kept[round * 16 + i] = program_block();
    dump("asked");
  }
  printf("kept %p\n", kept[31]);
  return 0;
}
