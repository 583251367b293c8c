/* One program in processes of several types, as Chromium runs: `typed_children SECONDS` (the
 * "browser", no --type) forks four children that exec this program again with
 *
 *   --type=a                                   (twice)    burn SECONDS in work_a
 *   --type=b                                              burn SECONDS in work_b
 *   --type=utility --utility-sub-type=net                 burn SECONDS in work_net
 *
 * (after a --lang=en flag, as Chromium puts its type among other switches), burns SECONDS in
 * work_browser, waits for them all and fails if one failed. Prints "checksum 1" at the end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#define BURN_ROUNDS
#include "common.h"
#include <unistd.h>

static volatile unsigned long sink;

__attribute__((noinline)) void work_browser(unsigned long n) { sink += burn(n); }
__attribute__((noinline)) void work_a(unsigned long n) { sink += burn(n); }
__attribute__((noinline)) void work_b(unsigned long n) { sink += burn(n); }
__attribute__((noinline)) void work_net(unsigned long n) { sink += burn(n); }

static void work(void (*fn)(unsigned long), double seconds) {
  struct cpu_deadline deadline = cpu_deadline_in(seconds);
  while (!cpu_deadline_passed(&deadline)) fn(200000);
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  const char *type = NULL;
  for (int i = 2; i < argc; i++)
    if (strncmp(argv[i], "--type=", 7) == 0) type = argv[i] + 7;
  if (type) {
    void (*fn)(unsigned long) = strcmp(type, "a") == 0 ? work_a : strcmp(type, "b") == 0 ? work_b : work_net;
    work(fn, atof(argv[1]));
    return 0;
  }
  char *children[][5] = {
      {argv[0], argv[1], "--lang=en", "--type=a", NULL},
      {argv[0], argv[1], "--lang=en", "--type=a", NULL},
      {argv[0], argv[1], "--lang=en", "--type=b", NULL},
      {argv[0], argv[1], "--type=utility", "--utility-sub-type=net", NULL},
  };
  pid_t pids[4];
  for (int i = 0; i < 4; i++) {
    pids[i] = fork();
    if (pids[i] == 0) {
      execv("/proc/self/exe", children[i]);
      _exit(127);
    }
  }
  work(work_browser, atof(argv[1]));
  int failed = 0;
  for (int i = 0; i < 4; i++) {
    int status = 0;
    if (pids[i] < 0 || waitpid(pids[i], &status, 0) != pids[i] || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      failed = 1;
  }
  if (failed) return 1;
  printf("checksum %d\n", sink != 0);
  return 0;
}
