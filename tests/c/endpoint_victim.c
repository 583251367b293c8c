/* A program that the HTTP endpoint (CPUPROF_HTTP) must leave alone while it is attacked.
 *
 *   endpoint_victim idle DIR      maps /dev/zero and a file whose mapped path is then a FIFO,
 *                                 writes "zero ADDR", "fifo ADDR" and "main ADDR" to DIR/addresses,
 *                                 then idles until standard input reaches end of file
 *   endpoint_victim takeover N    closes every descriptor from 3 up (close_range), opens its own
 *                                 listening socket (on the number cpuprof's listener had, if it
 *                                 had one), prints "port P" on stderr, serves N clients one line
 *                                 each, then waits for end of file on standard input
 *   endpoint_victim squat DIR     after a line on standard input, closes every descriptor from 3
 *                                 up and opens 16 files DIR/own.N on the freed numbers, prints
 *                                 "squatting"; at end of file writes "mine" through each, and
 *                                 prints "files intact" if each holds exactly that
 *
 * Prints "done" (idle), "served N" (takeover) or "files intact" (squat) at the end; exit
 * status 0 when all went well. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static int idle(const char *dir) {
  char path[4096], fifo[4096], out[4096];
  int zero = open("/dev/zero", O_RDONLY);
  void *z = mmap(NULL, 1 << 20, PROT_READ | PROT_EXEC, MAP_PRIVATE, zero, 0);
  if (zero < 0 || z == MAP_FAILED) return 10;
  close(zero);
  /* A mapped file that is then unlinked shows in /proc/self/maps as "PATH (deleted)"; a FIFO
   * created under that very name is what a reader opening the mapped path finds. */
  snprintf(path, sizeof path, "%s/mapped", dir);
  snprintf(fifo, sizeof fifo, "%s/mapped (deleted)", dir);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || ftruncate(fd, 4096) != 0) return 11;
  void *f = mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
  if (f == MAP_FAILED) return 12;
  close(fd);
  if (unlink(path) != 0 || mkfifo(fifo, 0600) != 0) return 13;
  snprintf(out, sizeof out, "%s/addresses", dir);
  FILE *addresses = fopen(out, "w");
  if (!addresses) return 14;
  fprintf(addresses, "zero %p\nfifo %p\nmain %p\n", (char *)z + 0x800, (char *)f + 0x10, (void *)idle);
  fclose(addresses);
  char byte;
  while (read(0, &byte, 1) > 0) {
  }
  munmap(z, 1 << 20);
  munmap(f, 4096);
  puts("done");
  return 0;
}

/* The lowest descriptor that is a listening socket, or -1. */
static int find_listener(void) {
  for (int fd = 3; fd < 1024; fd++) {
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening) return fd;
  }
  return -1;
}

static int takeover(int clients) {
  int theirs = find_listener();
  if (close_range(3, ~0U, 0) != 0) return 20;
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (s < 0 || bind(s, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(s, 64) != 0) return 21;
  if (theirs >= 0 && s != theirs) {
    if (dup2(s, theirs) != theirs) return 22;
    close(s);
    s = theirs;
  }
  socklen_t len = sizeof addr;
  getsockname(s, (struct sockaddr *)&addr, &len);
  /* stderr: the port differs from run to run, stdout must not. */
  fprintf(stderr, "port %d\n", ntohs(addr.sin_port));
  int served = 0;
  while (served < clients) {
    struct pollfd p = {.fd = s, .events = POLLIN};
    /* A client the program never sees (taken by someone else) must not hang it forever. */
    if (poll(&p, 1, 20000) <= 0) break;
    int c = accept(s, NULL, NULL);
    if (c < 0) continue;
    char line[64];
    int n = snprintf(line, sizeof line, "from the program %d\n", served);
    if (write(c, line, n) == n) served++;
    close(c);
  }
  printf("served %d\n", served);
  char byte;
  while (read(0, &byte, 1) > 0) {
  }
  return served == clients ? 0 : 1;
}

static int squat(const char *dir) {
  enum { FILES = 16 };
  char path[4096], byte;
  int fds[FILES];
  while (read(0, &byte, 1) > 0 && byte != '\n') {
  }
  if (close_range(3, ~0U, 0) != 0) return 30;
  for (int i = 0; i < FILES; i++) {
    snprintf(path, sizeof path, "%s/own.%d", dir, i);
    fds[i] = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fds[i] < 0) return 31;
  }
  puts("squatting");
  while (read(0, &byte, 1) > 0) {
  }
  int intact = 1;
  for (int i = 0; i < FILES; i++) {
    if (write(fds[i], "mine\n", 5) != 5 || close(fds[i]) != 0) {
      printf("descriptor %d: %s\n", fds[i], strerror(errno));
      intact = 0;
    }
    snprintf(path, sizeof path, "%s/own.%d", dir, i);
    char got[64] = {0};
    int fd = open(path, O_RDONLY);
    ssize_t n = read(fd, got, sizeof got - 1);
    close(fd);
    if (n != 5 || memcmp(got, "mine\n", 5) != 0) {
      printf("own.%d holds %zd bytes: %.20s\n", i, n, got);
      intact = 0;
    }
  }
  if (intact) puts("files intact");
  return intact ? 0 : 1;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc > 2 && !strcmp(argv[1], "idle")) return idle(argv[2]);
  if (argc > 2 && !strcmp(argv[1], "takeover")) return takeover(atoi(argv[2]));
  if (argc > 2 && !strcmp(argv[1], "squat")) return squat(argv[2]);
  fprintf(stderr, "usage: endpoint_victim idle DIR | takeover N | squat DIR\n");
  return 2;
}
