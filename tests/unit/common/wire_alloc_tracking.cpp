// Allocation accounting for the decode-under-hostile-input tests (wire_test_support.h): while
// g_alloc.on on a thread, every operator new records its size. Replacing the global operators is
// the only way to observe the allocations std::vector makes inside the decoder; they are
// replaced once for the whole test binary, here.
#include <algorithm>
#include <cstdlib>
#include <new>

#include "wire_test_support.h"

constinit thread_local wire_alloc_stats g_alloc{};

namespace {

void* tracked_alloc(std::size_t n) {
  if (g_alloc.on) {
    g_alloc.largest = std::max(g_alloc.largest, n);
    g_alloc.total += n;
  }
  return std::malloc(n == 0 ? 1 : n);
}

// Out of line so the compiler does not see operator new's pointer reach free() and warn.
[[gnu::noinline]] void tracked_free(void* p) noexcept { std::free(p); }
}  // namespace

void* operator new(std::size_t n) {
  if (void* p = tracked_alloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return tracked_alloc(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return tracked_alloc(n); }
void operator delete(void* p) noexcept { tracked_free(p); }
void operator delete[](void* p) noexcept { tracked_free(p); }
void operator delete(void* p, std::size_t) noexcept { tracked_free(p); }
void operator delete[](void* p, std::size_t) noexcept { tracked_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { tracked_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { tracked_free(p); }
