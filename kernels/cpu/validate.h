#pragma once
// Parameter checks shared by the CPU ops. A failed check throws invalid_argument_error whose
// message names the op, the field and the offending value, e.g.
//   "ssd_chunk_scan: chunk_size = 0 (must be > 0)".
// Checks run before any OpenMP region: an exception must not cross a parallel region.
#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>

#include "hyserve/common/error.h"

namespace hyserve::kernels::cpu_detail {

template <class T>
[[noreturn]] inline void fail(const char* op, const std::string& field, const T& value, const char* requirement) {
  std::ostringstream os;
  os << op << ": " << field << " = " << value << " (" << requirement << ")";
  throw invalid_argument_error(os.str());
}

inline void require_ptr(const void* ptr, const char* op, const char* field) {
  if (ptr == nullptr) fail(op, field, "null", "required pointer");
}

inline void require_positive(int64_t value, const char* op, const char* field) {
  if (value <= 0) fail(op, field, value, "must be > 0");
}

inline void require_non_negative(int64_t value, const char* op, const char* field) {
  if (value < 0) fail(op, field, value, "must be >= 0");
}

// A field and its value, for the checks of several fields of one kind at once: they run in the
// order given, so the first failing field is the one reported.
template <class T>
struct named {
  T value;
  const char* field;
};

// Each pointer must be set.
inline void require_ptrs(const char* op, std::initializer_list<named<const void*>> ptrs) {
  for (const auto& p : ptrs) require_ptr(p.value, op, p.field);
}

// Each size must be > 0.
inline void require_sizes(const char* op, std::initializer_list<named<int64_t>> sizes) {
  for (const auto& s : sizes) require_positive(s.value, op, s.field);
}

// Each count must be >= 0.
inline void require_counts(const char* op, std::initializer_list<named<int64_t>> counts) {
  for (const auto& c : counts) require_non_negative(c.value, op, c.field);
}

// Multi-token ops: tokens_per_row >= 1 tokens per row, each writing one of `steps` step columns.
inline void require_step_columns(int64_t tokens_per_row, int64_t steps, const char* op) {
  require_positive(tokens_per_row, op, "tokens_per_row");
  if (steps < tokens_per_row)
    fail(op, "steps", steps, ("must be >= tokens_per_row = " + std::to_string(tokens_per_row)).c_str());
}

// A row stride must cover the row it addresses.
inline void require_stride(int64_t stride, int64_t row_elems, const char* op, const char* field) {
  if (stride < row_elems) {
    fail(op, field, stride, ("must be >= row length " + std::to_string(row_elems)).c_str());
  }
}

// Each row stride must cover a row of row_elems.
inline void require_strides(int64_t row_elems, const char* op, std::initializer_list<named<int64_t>> strides) {
  for (const auto& s : strides) require_stride(s.value, row_elems, op, s.field);
}

// query_start_loc[0..batch] must start at >= 0 and be non-decreasing.
inline void require_query_start_loc(const int32_t* qsl, int64_t batch, const char* op) {
  if (qsl[0] < 0) fail(op, "query_start_loc[0]", qsl[0], "must be >= 0");
  for (int64_t b = 0; b < batch; ++b) {
    if (qsl[b + 1] < qsl[b]) {
      fail(op, "query_start_loc[" + std::to_string(b + 1) + "]", qsl[b + 1], "must be >= the previous entry");
    }
  }
}

// state_indices[b] is a slot (>= 0) or -1 for a padding row.
inline void require_state_indices(const int32_t* idx, int64_t batch, const char* op) {
  for (int64_t b = 0; b < batch; ++b) {
    if (idx[b] < -1) fail(op, "state_indices[" + std::to_string(b) + "]", idx[b], "must be a slot >= 0 or -1");
  }
}

}  // namespace hyserve::kernels::cpu_detail
