#pragma once
// Typed reads of request fields. Every reader names the field path (`param`) in its error so
// that the client learns which field is wrong: "sampling_params.top_k must be an integer, got a
// string". Absent fields and JSON null mean "use the default" and are handled by the caller
// through field().
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include "coordinator/api/api_error.h"

namespace hyserve::coordinator::api {

// The body as one JSON object: malformed JSON or another kind of value is a 400 (param null).
parse_result<boost::json::object> parse_object_body(std::string_view body);

// The field's value, or nullptr when it is absent or null.
const boost::json::value* field(const boost::json::object& obj, std::string_view key);

// An integer: a JSON integer, or a number with an integral value, within int64.
std::optional<api_error> read_integer(const boost::json::value& v, std::string_view param, int64_t& out);
// Any JSON number (integers included). Non-finite values (1e999 parses as infinity) are
// returned as such: range checks belong to the caller.
std::optional<api_error> read_number(const boost::json::value& v, std::string_view param, double& out);
std::optional<api_error> read_bool(const boost::json::value& v, std::string_view param, bool& out);
// A seed: any integer in int64 or uint64 (negative values keep their bit pattern).
std::optional<api_error> read_seed(const boost::json::value& v, std::string_view param, uint64_t& out);

// An array of token ids, each in [0, vocab_size). The message of an out-of-range id names the
// id and the vocabulary size.
std::optional<api_error> read_token_ids(const boost::json::value& v, std::string_view param, int64_t vocab_size,
                                        std::vector<int32_t>& out);

// True when `v` is an array whose elements are all integers (token ids, unchecked).
bool is_integer_array(const boost::json::value& v);

}  // namespace hyserve::coordinator::api
