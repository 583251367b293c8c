// C++ allocations under a heap profile: new[] and delete[], new and delete of objects,
// std::vector and std::string growth, a std::bad_alloc thrown and caught. Prints a checksum.
#include <cstdio>
#include <new>
#include <string>
#include <vector>

struct Node {
  Node *next;
  long value[7];
};

// Seen by the compiler as escaping: a new/delete pair it can see through may be elided.
int *volatile escaped;

__attribute__((noinline)) long arrays(int n) {
  long sum = 0;
  for (int i = 0; i < n; i++) {
    int *a = new int[100 + i % 5000];
    escaped = a;
    a[0] = i;
    sum += a[0];
    delete[] a;
  }
  return sum;
}

int main() {
  long sum = arrays(200000);
  Node *head = nullptr;
  for (int i = 0; i < 100000; i++) head = new Node{head, {i}};
  for (Node *n = head; n;) {
    Node *next = n->next;
    sum += n->value[0];
    delete n;
    n = next;
  }
  std::vector<std::string> words;
  for (int i = 0; i < 50000; i++) words.push_back(std::string(i % 300, 'x'));
  sum += static_cast<long>(words.size());
  bool caught = false;
  try {
    char *huge = new char[static_cast<size_t>(1) << 62];
    huge[0] = 0;
  } catch (const std::bad_alloc &) {
    caught = true;
  }
  std::printf("sum %ld caught %d\n", sum, caught ? 1 : 0);
  return 0;
}
