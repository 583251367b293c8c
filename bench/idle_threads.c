/* A server at rest: THREADS threads blocked in pthread_cond_wait and main asleep for SECONDS,
 * so that all the CPU the process uses is the profiler's own. bench/idle_threads.py runs it
 * and reads each thread's CPU time from /proc.
 *
 *   idle_threads THREADS SECONDS     prints "ready" once every thread waits, "done" at the end */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t never = PTHREAD_COND_INITIALIZER;
static pthread_cond_t arrived = PTHREAD_COND_INITIALIZER;
static int waiting, released;

static void *idle(void *arg) {
  (void)arg;
  pthread_mutex_lock(&lock);
  waiting++;
  pthread_cond_signal(&arrived);
  while (!released) pthread_cond_wait(&never, &lock);
  pthread_mutex_unlock(&lock);
  return NULL;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1000;
  double seconds = argc > 2 ? atof(argv[2]) : 20;
  pthread_t *t = calloc(threads, sizeof *t);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64 * 1024);
  for (int i = 0; i < threads; i++)
    if (pthread_create(&t[i], &attr, idle, NULL) != 0) {
      fprintf(stderr, "pthread_create failed at thread %d\n", i);
      return 1;
    }
  pthread_mutex_lock(&lock);
  while (waiting < threads) pthread_cond_wait(&arrived, &lock);
  pthread_mutex_unlock(&lock);
  printf("ready\n");
  fflush(stdout);
  usleep((useconds_t)(seconds * 1e6));
  pthread_mutex_lock(&lock);
  released = 1;
  pthread_cond_broadcast(&never);
  pthread_mutex_unlock(&lock);
  for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
  printf("done\n");
  return 0;
}
