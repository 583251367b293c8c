/* Programs that are hard on a profiler. Each mode prints what it observed; the tests run it
 * with and without the profiler and require the same output and exit status.
 *
 *   hostile deep          recursion 100,000 frames deep, burning CPU at the bottom
 *   hostile smallstack    a thread on a 64 KiB stack with ~12 KiB left, burning CPU
 *   hostile inhandler     CPU burnt inside the program's own SIGUSR1 and SIGSEGV handlers
 *   hostile jit           CPU burnt in generated code with no unwind info, called with garbage RBP
 *   hostile blockall      a thread that blocks every signal while burning CPU
 *   hostile fork          fork without exec; the child burns CPU and exits 7
 *   hostile spawn         fork+exec, vfork+exec, posix_spawn and system() in a loop
 *   hostile exec          execve of /bin/sh with an empty environment after burning CPU
 *   hostile syscalls      nanosleep, poll, pipe read and epoll_wait loops beside a busy thread
 *   hostile ownsig        installs its own SIGPROF handler and timer after profiling started
 *   hostile distinct      many distinct call chains (fills the table and the disk)
 *   hostile segv          burns CPU for 3 s, then dies of SIGSEGV */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>
#define BURN_SECONDS
#include "common.h"

extern char **environ;
static volatile unsigned long sink;

static void *burn_thread(void *arg) {
  burn(*(double *)arg);
  return NULL;
}

/* deep */
static int (*volatile recurse_ptr)(int);
__attribute__((noinline)) static int recurse(int depth) {
  if (depth == 0) {
    burn(1.0);
    return 0;
  }
  return recurse_ptr(depth - 1) + 1;
}

/* smallstack */
static char *stack_top;
__attribute__((noinline)) static int use_stack(void) {
  volatile char pad[512];
  pad[0] = 1;
  if (stack_top - (char *)pad < 52 * 1024) return use_stack() + pad[0];
  burn(1.0);
  return pad[0];
}
static void *small_stack_thread(void *arg) {
  (void)arg;
  char here;
  stack_top = &here;
  use_stack();
  return NULL;
}

/* inhandler */
static char *guarded;
static void on_usr1(int sig) { (void)sig; burn(0.5); }
static void on_segv(int sig) {
  (void)sig;
  burn(0.5);
  mprotect(guarded, 4096, PROT_READ | PROT_WRITE);
}

/* distinct */
static int (*volatile chain_ptr)(int, int);
__attribute__((noinline)) static int chain(int depth, int salt) {
  if (depth == 0) {
    for (int i = 0; i < 20000 + salt; i++) sink = sink * 31 + i;
    return 0;
  }
  return chain_ptr(depth - 1, salt) + (salt & 1);
}

static int eintr;
static void count(int r) {
  if (r < 0 && errno == EINTR) eintr++;
}

static volatile sig_atomic_t own_ticks;
static void own_prof(int sig) { (void)sig; own_ticks++; }

static int run(const char *mode) {
  double one = 1.0, half = 0.5;
  pthread_t t;
  if (!strcmp(mode, "deep")) {
    recurse_ptr = recurse;
    printf("depth %d\n", recurse(100000));
  } else if (!strcmp(mode, "smallstack")) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    pthread_create(&t, &attr, small_stack_thread, NULL);
    pthread_join(t, NULL);
    puts("ok");
  } else if (!strcmp(mode, "inhandler")) {
    signal(SIGUSR1, on_usr1);
    raise(SIGUSR1);
    guarded = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    signal(SIGSEGV, on_segv);
    guarded[0] = 42; /* faults once; the handler burns CPU, then allows the write */
    printf("guarded %d\n", guarded[0]);
  } else if (!strcmp(mode, "jit")) {
#if defined(__aarch64__)
    /* mov x9, 200000; 1: subs x9, x9, 1; b.ne 1b; ret */
    static const unsigned int code[] = {0xd281a809, 0xf2a00069, 0xf1000529, 0x54ffffe1, 0xd65f03c0};
#else
    /* mov rcx, 200000; 1: dec rcx; jnz 1b; ret */
    static const unsigned char code[] = {0x48, 0xc7, 0xc1, 0x40, 0x0d, 0x03, 0x00, 0x48, 0xff, 0xc9, 0x75, 0xfb, 0xc3};
#endif
    unsigned char *buf = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memcpy(buf, code, sizeof code);
    __builtin___clear_cache((char *)buf, (char *)buf + sizeof code);
    void (*jitted)(void) = (void (*)(void))buf;
    double end = thread_cpu() + 1.0;
    unsigned long calls = 0;
    while (thread_cpu() < end) {
#if defined(__aarch64__)
      __asm__ volatile("mov x10, x29\n\tmov x29, %1\n\tblr %0\n\tmov x29, x10"
                       : : "r"(jitted), "r"(0xdeadbeef1UL) : "x9", "x10", "x30", "memory", "cc");
#else
      __asm__ volatile("push %%rbp\n\tmov $0xdeadbeef1, %%rbp\n\tcall *%0\n\tpop %%rbp" : : "r"(jitted) : "rcx", "memory");
#endif
      calls++;
    }
    puts(calls > 0 ? "ok" : "no calls");
  } else if (!strcmp(mode, "blockall")) {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    pthread_create(&t, NULL, burn_thread, &half); /* inherits the full mask */
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, NULL);
    burn(0.5);
    pthread_join(t, NULL);
    puts("ok");
  } else if (!strcmp(mode, "fork")) {
    burn(0.3);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      burn(0.3);
      exit(7);
    }
    int status;
    waitpid(pid, &status, 0);
    burn(0.3);
    printf("child %d\n", WEXITSTATUS(status));
  } else if (!strcmp(mode, "spawn")) {
    pthread_create(&t, NULL, burn_thread, &one);
    int failures = 0, runs = 0;
    char *argv[] = {"/bin/true", NULL};
    for (int i = 0; i < 15; i++) {
      int status;
      pid_t pid = fork();
      if (pid == 0) {
        execv(argv[0], argv);
        _exit(127);
      }
      failures += waitpid(pid, &status, 0) != pid || status != 0;
      pid = vfork();
      if (pid == 0) {
        execv(argv[0], argv);
        _exit(127);
      }
      failures += waitpid(pid, &status, 0) != pid || status != 0;
      failures += posix_spawn(&pid, argv[0], NULL, NULL, argv, environ) != 0 || waitpid(pid, &status, 0) != pid || status != 0;
      failures += system("true") != 0;
      runs += 4;
    }
    pthread_join(t, NULL);
    printf("spawned %d failures %d\n", runs, failures);
  } else if (!strcmp(mode, "exec")) {
    burn(0.3);
    fflush(stdout);
    char *envp[] = {NULL};
    char *argv[] = {"sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo exec-ok", NULL};
    execve("/bin/sh", argv, envp);
    return 9;
  } else if (!strcmp(mode, "syscalls")) {
    pthread_create(&t, NULL, burn_thread, &one);
    int fds[2];
    if (pipe(fds) != 0) return 2;
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN}, out;
    epoll_ctl(ep, EPOLL_CTL_ADD, fds[0], &ev);
    for (int i = 0; i < 150; i++) {
      struct timespec ms = {0, 1000000};
      count(nanosleep(&ms, NULL));
      count(poll(NULL, 0, 1));
      count(epoll_wait(ep, &out, 1, 1));
      char c = 'x';
      count(write(fds[1], &c, 1));
      count(read(fds[0], &c, 1));
    }
    pthread_join(t, NULL);
    printf("eintr %d\n", eintr);
  } else if (!strcmp(mode, "ownsig")) {
    signal(SIGPROF, own_prof);
    struct itimerval every_10ms = {{0, 10000}, {0, 10000}};
    setitimer(ITIMER_PROF, &every_10ms, NULL);
    burn(1.0);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &off, NULL);
    /* ~100 expected from its own timer; profiler signals would add many more */
    printf("own ticks in range %d\n", own_ticks >= 60 && own_ticks <= 140);
  } else if (!strcmp(mode, "distinct")) {
    chain_ptr = chain;
    double end = thread_cpu() + 2.0;
    unsigned salt = 1;
    while (thread_cpu() < end) {
      salt = salt * 1103515245u + 12345u;
      chain(salt % 200, salt % 7);
    }
    puts("ok");
  } else if (!strcmp(mode, "segv")) {
    burn(3.0);
    fflush(stdout);
    signal(SIGSEGV, SIG_DFL);
    raise(SIGSEGV);
  } else {
    return 2;
  }
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  return run(argc > 1 ? argv[1] : "");
}
