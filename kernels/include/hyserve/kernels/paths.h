#pragma once
// The kernel paths (hyserve/common/kernel_paths.h: the config's `kernels:` section) of the op a
// thread is running. kernels::run opens a paths_scope with exec_context::paths around each
// run_cuda call, so the launchers read the choice where they make it (some several layers below
// run_cuda: the launch attribute of PDL, the cluster size of a GDN prefill kernel) without every
// run_cuda and launcher signature carrying it; a call outside any scope (tests and benchmarks
// calling run_cuda directly) sees the defaults, or the paths of a scope it opens itself.
// Per call: two thread-local pointer stores. Header-only and CUDA-free (.cu files include it).
#include "hyserve/common/kernel_paths.h"

namespace hyserve::kernels {

using hyserve::kernel_paths;

namespace paths_detail {
inline const kernel_paths kDefaults{};
inline thread_local const kernel_paths* current = nullptr;
}  // namespace paths_detail

// The paths of the innermost open scope on this thread; the defaults when none is open.
inline const kernel_paths& current_paths() noexcept {
  return paths_detail::current != nullptr ? *paths_detail::current : paths_detail::kDefaults;
}

// While it lives, current_paths() on this thread is `paths` (which must outlive the scope).
// Scopes nest.
class paths_scope {
 public:
  explicit paths_scope(const kernel_paths& paths) noexcept : previous_(paths_detail::current) {
    paths_detail::current = &paths;
  }
  ~paths_scope() { paths_detail::current = previous_; }
  paths_scope(const paths_scope&) = delete;
  paths_scope& operator=(const paths_scope&) = delete;

 private:
  const kernel_paths* previous_;
};

}  // namespace hyserve::kernels
