/* A non-PIE program that takes malloc's address, as Debian's python3 does (its allocator table
 * holds &malloc): the executable then has a "canonical PLT" entry named malloc, which dlsym
 * answers for the name although the program defines no malloc. Its heap profile must be on.
 *
 *   non_pie_malloc      keeps 64 blocks of 1 MiB allocated through a pointer to malloc, in
 *                       through_pointer, until exit; prints "ok". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *(*volatile allocate)(size_t);

__attribute__((noinline)) void *through_pointer(size_t n) {
  void *p = allocate(n);
  memset(p, 1, n);
  return p;
}

int main(void) {
  /* Taken in code, an absolute address in a non-PIE program: the canonical PLT entry. */
  allocate = malloc;
  static void *kept[64];
  for (int i = 0; i < 64; i++) kept[i] = through_pointer(1 << 20);
  puts("ok");
  return kept[63] == NULL;
}
