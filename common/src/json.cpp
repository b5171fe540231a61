// The single translation unit that compiles Boost.JSON (header-only use), plus the small
// helpers declared in json.h.
#include "hyserve/common/json.h"

#include <boost/json/src.hpp>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace hyserve {

std::optional<boost::json::value> parse_json(std::string_view text, std::string& error) {
  boost::json::stream_parser parser;
  boost::system::error_code ec;
  // write_some stops at the first error; the count it returns is the offset of that error.
  const size_t consumed = parser.write_some(text.data(), text.size(), ec);
  if (!ec && consumed < text.size()) {
    error = "unexpected trailing data at byte " + std::to_string(consumed);
    return std::nullopt;
  }
  if (!ec) parser.finish(ec);
  if (ec) {
    error = ec.message() + " at byte " + std::to_string(consumed);
    return std::nullopt;
  }
  return parser.release();
}

std::optional<std::string> read_text_file(const std::string& path, std::string& error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = std::strerror(errno);
    return std::nullopt;
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) {
    error = "read error";
    return std::nullopt;
  }
  return std::move(buf).str();
}

std::string json_excerpt(const boost::json::value& v) {
  constexpr size_t kMaxChars = 60;
  std::string s = boost::json::serialize(v);
  if (s.size() > kMaxChars) s = s.substr(0, kMaxChars) + "...";
  return s;
}

std::string_view json_kind_name(const boost::json::value& v) {
  switch (v.kind()) {
    case boost::json::kind::null: return "null";
    case boost::json::kind::bool_: return "a boolean";
    case boost::json::kind::int64:
    case boost::json::kind::uint64: return "an integer";
    case boost::json::kind::double_: return "a number";
    case boost::json::kind::string: return "a string";
    case boost::json::kind::array: return "an array";
    case boost::json::kind::object: return "an object";
  }
  return "?";
}

}  // namespace hyserve
