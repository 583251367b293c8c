/* A program that defines malloc itself (as Chromium does), started again through
 * /proc/self/exe (as Chromium starts its zygote): the heap profile is off in both processes,
 * and the reason said is the program's own malloc (tests/heap_hostile.rs).
 *
 *   own_malloc          execs /proc/self/exe again, which prints "ok" */
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>

extern void *__libc_malloc(size_t size);

void *malloc(size_t size) { return __libc_malloc(size); }

int main(int argc, char **argv) {
  if (argc < 2) {
    execl("/proc/self/exe", argv[0], "again", (char *)NULL);
    perror("execl");
    return 1;
  }
  puts("ok");
  return 0;
}
