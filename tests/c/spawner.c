/* A program that runs others and reads what they print (tests/descendants.rs): what it
 * captures must be what it captures without the profiler.
 *
 *   system N    runs `true` through system() N times, then one command whose stderr it reads
 *               through popen("... 2>&1"), and prints what it read
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  int n = argc > 2 ? atoi(argv[2]) : 300;
  int failed = 0;
  for (int i = 0; i < n; i++)
    if (system("true") != 0) failed++;
  printf("system %d failed %d\n", n, failed);
  /* The shell's and its commands' stderr joined to the pipe. */
  FILE *p = popen("(echo to-stdout; ls /nonexistent-cpuprof-path; echo to-stderr >&2) 2>&1", "r");
  if (!p) return 1;
  char line[512];
  while (fgets(line, sizeof line, p)) printf("captured: %s", line);
  printf("status %d\n", pclose(p));
  return 0;
}
