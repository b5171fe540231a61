#pragma once
// Test helpers for the common/ tests: a scratch directory removed on destruction, file writing,
// a builder for small safetensors files (valid or deliberately broken) and an error-message
// expectation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace hyserve::test {

// A fresh directory under the system temp dir, deleted with its contents on destruction.
class scratch_dir {
 public:
  scratch_dir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("hyserve_common_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file from a header JSON text and a data section: u64 little-endian header
// length, header, data.
inline std::string safetensors_bytes(const std::string& header_json, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header_json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xffu);
  return out + header_json + data;
}

struct st_tensor {
  std::string name;
  std::string dtype;  // safetensors spelling: F32, BF16, ...
  std::vector<int64_t> shape;
  std::string bytes;  // raw little-endian elements
};

template <typename T>
std::string raw_bytes(const std::vector<T>& v) {
  std::string s(v.size() * sizeof(T), '\0');
  if (!v.empty()) std::memcpy(s.data(), v.data(), s.size());
  return s;
}

// Lays the tensors out back to back in the given order and writes a consistent header.
inline std::string build_safetensors(const std::vector<st_tensor>& tensors, bool with_metadata = true) {
  std::string header = "{";
  std::string data;
  if (with_metadata) header += "\"__metadata__\":{\"format\":\"pt\"}";
  for (const auto& t : tensors) {
    if (header.size() > 1) header += ",";
    header += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) header += (i ? "," : "") + std::to_string(t.shape[i]);
    header += "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
              std::to_string(data.size() + t.bytes.size()) + "]}";
    data += t.bytes;
  }
  header += "}";
  return safetensors_bytes(header, data);
}

inline std::string fixture_dir() { return std::string(HYSERVE_SOURCE_DIR) + "/tests/fixtures/bamba-tiny"; }

}  // namespace hyserve::test

// Expects `stmt` to throw `type` whose message contains every one of the given substrings.
#define EXPECT_ERROR_WITH(stmt, type, ...)                                                                 \
  do {                                                                                                     \
    try {                                                                                                  \
      stmt;                                                                                                \
      ADD_FAILURE() << "expected " #type " from: " #stmt;                                                  \
    } catch (const type& e_) {                                                                             \
      const std::string what_ = e_.what();                                                                 \
      const std::vector<std::string> parts_{__VA_ARGS__};                                                  \
      for (const std::string& part_ : parts_)                                                              \
        EXPECT_NE(what_.find(part_), std::string::npos) << "message: " << what_ << "\nmissing: " << part_; \
    } catch (const std::exception& e_) {                                                                   \
      ADD_FAILURE() << "expected " #type ", got another exception: " << e_.what();                         \
    }                                                                                                      \
  } while (0)
