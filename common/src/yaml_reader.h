#pragma once
// The YAML walking helpers of the config loader (config.cpp, the only includer): a reader whose
// every error names the dotted key path (and the file's line), and the small functions around
// it. yaml-cpp stays out of the public config header.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "hyserve/common/error.h"

namespace hyserve::config_detail {

inline std::string join(std::initializer_list<std::string_view> items) {
  std::string s;
  for (std::string_view i : items) {
    if (!s.empty()) s += ", ";
    s += i;
  }
  return s;
}

inline std::string_view node_kind_name(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null: return "null";
    case YAML::NodeType::Sequence: return "a sequence";
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Scalar: return "a scalar";
    case YAML::NodeType::Undefined: return "nothing";
  }
  return "?";
}

// Absent keys come back from a const operator[] as undefined nodes, whose Type() throws.
inline bool is_map(const YAML::Node& n) { return n.IsDefined() && n.IsMap(); }

// Walks the YAML tree. Every error is "<dotted.path>: <reason>", prefixed with
// "<file>:<line>: " when the text came from a file.
class yaml_reader {
 public:
  explicit yaml_reader(std::string file) : file_(std::move(file)) {}
  // The config file's path; empty for a config given as a string.
  const std::string& file() const { return file_; }

  [[noreturn]] void fail(const YAML::Node& at, const std::string& path, const std::string& what) const {
    std::string prefix;
    if (!file_.empty()) {
      prefix = file_;
      if (at.IsDefined() && at.Mark().line >= 0) prefix += ":" + std::to_string(at.Mark().line + 1);
      prefix += ": ";
    }
    throw config_error(prefix + path + ": " + what);
  }

  // A section must be a mapping whose keys are all in `known` (a null section means "all
  // defaults"). Returns the keys present.
  std::set<std::string> check_keys(const YAML::Node& node, const std::string& path,
                                   std::initializer_list<std::string_view> known) const {
    std::set<std::string> seen;
    if (!node.IsDefined() || node.IsNull()) return seen;
    if (!node.IsMap()) fail(node, path, "expected a mapping, got " + describe(node));
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (!it->first.IsScalar()) fail(it->first, path, "mapping keys must be plain names");
      const std::string key = it->first.Scalar();
      const std::string key_path = path.empty() ? key : path + "." + key;
      if (std::find(known.begin(), known.end(), key) == known.end())
        fail(it->first, key_path, "unknown key (known: " + join(known) + ")");
      if (!seen.insert(key).second) fail(it->first, key_path, "duplicate key");
    }
    return seen;
  }

  std::string describe(const YAML::Node& n) const {
    if (n.IsScalar()) return "'" + n.Scalar() + "'";
    return std::string(node_kind_name(n));
  }

  const std::string& scalar(const YAML::Node& n, const std::string& path, std::string_view expected) const {
    if (!n.IsScalar()) fail(n, path, "expected " + std::string(expected) + ", got " + describe(n));
    return n.Scalar();
  }

  int64_t get_int64(const YAML::Node& n, const std::string& path) const {
    const std::string& s = scalar(n, path, "an integer");
    int64_t v = 0;
    const char* first = s.data();
    if (!s.empty() && s[0] == '+') ++first;
    const auto [ptr, ec] = std::from_chars(first, s.data() + s.size(), v);
    if (ec == std::errc::result_out_of_range) fail(n, path, "integer out of range, got " + s);
    if (ec != std::errc() || ptr != s.data() + s.size() || s.empty())
      fail(n, path, "expected an integer, got '" + s + "'");
    return v;
  }

  int32_t get_int32(const YAML::Node& n, const std::string& path) const {
    const int64_t v = get_int64(n, path);
    if (v < INT32_MIN || v > INT32_MAX) fail(n, path, "integer out of range, got " + std::to_string(v));
    return static_cast<int32_t>(v);
  }

  uint64_t get_uint64(const YAML::Node& n, const std::string& path) const {
    const std::string& s = scalar(n, path, "a non-negative integer");
    uint64_t v = 0;
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || ptr != s.data() + s.size() || s.empty())
      fail(n, path, "expected a non-negative integer, got '" + s + "'");
    return v;
  }

  double get_double(const YAML::Node& n, const std::string& path) const {
    const std::string& s = scalar(n, path, "a number");
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(v))
      fail(n, path, "expected a finite number, got '" + s + "'");
    return v;
  }

  float get_float(const YAML::Node& n, const std::string& path) const {
    const double v = get_double(n, path);
    if (std::fabs(v) > static_cast<double>(FLT_MAX)) fail(n, path, "number out of float range, got " + n.Scalar());
    return static_cast<float>(v);
  }

  bool get_bool(const YAML::Node& n, const std::string& path) const {
    const std::string& s = scalar(n, path, "a boolean");
    if (s == "true" || s == "True" || s == "TRUE" || s == "yes" || s == "on") return true;
    if (s == "false" || s == "False" || s == "FALSE" || s == "no" || s == "off") return false;
    fail(n, path, "expected a boolean (true or false), got '" + s + "'");
  }

  std::string get_string(const YAML::Node& n, const std::string& path) const { return scalar(n, path, "a string"); }

  // Scalar that must be one of `known`; returns its index in the list.
  size_t get_enum(const YAML::Node& n, const std::string& path, std::string_view what,
                  std::initializer_list<std::string_view> known) const {
    const std::string& s = scalar(n, path, "one of: " + join(known));
    const auto it = std::find(known.begin(), known.end(), s);
    if (it == known.end()) fail(n, path, "unknown " + std::string(what) + " '" + s + "' (known: " + join(known) + ")");
    return static_cast<size_t>(it - known.begin());
  }

  // A duration in seconds: finite, > 0 (or >= 0 when zero means "do not wait").
  double get_seconds(const YAML::Node& n, const std::string& path, bool allow_zero) const {
    const double v = get_double(n, path);
    if (v < 0.0 || (!allow_zero && v == 0.0))
      fail(n, path, std::string(allow_zero ? "must be >= 0" : "must be > 0") + ", got " + n.Scalar());
    return v;
  }

  // Integer with a lower bound: "<path>: must be >= lo, got v".
  int32_t get_int32_min(const YAML::Node& n, const std::string& path, int32_t lo) const {
    const int32_t v = get_int32(n, path);
    if (v < lo) fail(n, path, "must be >= " + std::to_string(lo) + ", got " + std::to_string(v));
    return v;
  }

  int64_t get_int64_min(const YAML::Node& n, const std::string& path, int64_t lo) const {
    const int64_t v = get_int64(n, path);
    if (v < lo) fail(n, path, "must be >= " + std::to_string(lo) + ", got " + std::to_string(v));
    return v;
  }

 private:
  std::string file_;
};

// Calls `read(section[key])` when the key is present.
template <typename Fn>
void if_present(const YAML::Node& section, const char* key, Fn&& read) {
  if (is_map(section) && section[key]) read(section[key]);
}

}  // namespace hyserve::config_detail
