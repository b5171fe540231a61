#include "coordinator/api/json_fields.h"

#include <cmath>
#include <limits>
#include <string>

#include <boost/json.hpp>

#include "hyserve/common/json.h"

namespace hyserve::coordinator::api {
namespace {

api_error wrong_type(std::string_view param, std::string_view expected, const boost::json::value& got) {
  return invalid_param(std::string(param), std::string(param) + " must be " + std::string(expected) + ", got " +
                                               std::string(json_kind_name(got)) + " (" + json_excerpt(got) + ")");
}

}  // namespace

parse_result<boost::json::object> parse_object_body(std::string_view body) {
  std::string reason;
  std::optional<boost::json::value> doc = parse_json(body, reason);
  if (!doc) return invalid_param("", "malformed JSON in the request body: " + reason);
  if (!doc->is_object()) {
    return invalid_param("", "the request body must be a JSON object, got " + std::string(json_kind_name(*doc)));
  }
  return std::move(doc->as_object());
}

const boost::json::value* field(const boost::json::object& obj, std::string_view key) {
  const boost::json::value* v = obj.if_contains(key);
  if (v == nullptr || v->is_null()) return nullptr;
  return v;
}

std::optional<api_error> read_integer(const boost::json::value& v, std::string_view param, int64_t& out) {
  if (v.is_int64()) {
    out = v.get_int64();
    return std::nullopt;
  }
  if (v.is_uint64()) {
    if (v.get_uint64() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return invalid_param(std::string(param), std::string(param) + " is out of range: " + json_excerpt(v));
    }
    out = static_cast<int64_t>(v.get_uint64());
    return std::nullopt;
  }
  if (v.is_double()) {
    const double d = v.get_double();
    // 2^63 is exactly representable; anything at or above it does not fit.
    if (std::isfinite(d) && d == std::trunc(d) && d >= -9223372036854775808.0 && d < 9223372036854775808.0) {
      out = static_cast<int64_t>(d);
      return std::nullopt;
    }
  }
  return wrong_type(param, "an integer", v);
}

std::optional<api_error> read_number(const boost::json::value& v, std::string_view param, double& out) {
  if (v.is_int64()) {
    out = static_cast<double>(v.get_int64());
  } else if (v.is_uint64()) {
    out = static_cast<double>(v.get_uint64());
  } else if (v.is_double()) {
    out = v.get_double();
  } else {
    return wrong_type(param, "a number", v);
  }
  return std::nullopt;
}

std::optional<api_error> read_bool(const boost::json::value& v, std::string_view param, bool& out) {
  if (!v.is_bool()) return wrong_type(param, "a boolean", v);
  out = v.get_bool();
  return std::nullopt;
}

std::optional<api_error> read_seed(const boost::json::value& v, std::string_view param, uint64_t& out) {
  if (v.is_uint64()) {
    out = v.get_uint64();
    return std::nullopt;
  }
  int64_t signed_seed = 0;
  if (auto e = read_integer(v, param, signed_seed)) return e;
  out = static_cast<uint64_t>(signed_seed);
  return std::nullopt;
}

std::optional<api_error> read_token_ids(const boost::json::value& v, std::string_view param, int64_t vocab_size,
                                        std::vector<int32_t>& out) {
  if (!v.is_array()) return wrong_type(param, "an array of token ids (integers)", v);
  const boost::json::array& arr = v.get_array();
  out.clear();
  out.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    int64_t id = 0;
    if (!arr[i].is_int64() && !arr[i].is_uint64()) {
      return invalid_param(std::string(param), std::string(param) + "[" + std::to_string(i) +
                                                   "] must be an integer token id, got " +
                                                   std::string(json_kind_name(arr[i])) + " (" +
                                                   json_excerpt(arr[i]) + ")");
    }
    const bool too_big = arr[i].is_uint64() &&
                         arr[i].get_uint64() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    id = too_big ? std::numeric_limits<int64_t>::max() : arr[i].to_number<int64_t>();
    if (id < 0 || id >= vocab_size) {
      return invalid_param(std::string(param),
                           "token id " + (too_big ? json_excerpt(arr[i]) : std::to_string(id)) + " in " +
                               std::string(param) + " is outside the vocabulary: ids must be in [0, " +
                               std::to_string(vocab_size) + ") for vocab_size " + std::to_string(vocab_size));
    }
    out.push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

bool is_integer_array(const boost::json::value& v) {
  if (!v.is_array()) return false;
  for (const auto& e : v.get_array()) {
    if (!e.is_int64() && !e.is_uint64()) return false;
  }
  return true;
}

}  // namespace hyserve::coordinator::api
