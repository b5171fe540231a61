#pragma once
// JSON helpers shared by the safetensors header reader, the config.json reader and the
// checkpoint index reader. Boost.JSON is used header-only: json.cpp is the one translation unit
// that compiles its sources. Nothing here throws Boost exceptions; callers turn the returned
// error text into their own hyserve error type (format_error for data files, config_error for
// configuration).
#include <boost/json/value.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace hyserve {

// Parses `text` as one JSON document. On failure returns nullopt and sets `error` to a short
// reason with the byte offset ("syntax error at byte 12").
std::optional<boost::json::value> parse_json(std::string_view text, std::string& error);

// Reads a whole file. On failure returns nullopt and sets `error` (strerror text).
std::optional<std::string> read_text_file(const std::string& path, std::string& error);

// Compact, bounded rendering of a value for error messages: strings quoted, long values cut
// to about 60 characters with "...".
std::string json_excerpt(const boost::json::value& v);

// Name of the JSON kind for "expected X, got <kind>" messages: "null", "a string", "an array"...
std::string_view json_kind_name(const boost::json::value& v);

}  // namespace hyserve
