#pragma once
// A complete HTTP response as the handlers describe it; the session turns it into a Beast
// message. Keeping Beast out of this header keeps it out of every handler's translation unit.
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/json/value.hpp>

namespace hyserve::coordinator::http {

struct response {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers (Allow, Retry-After, ...)
};

// JSON text with numbers in plain decimal notation (74.859148, never 7.4859148E1); non-finite
// doubles become null.
std::string json_text(const boost::json::value& v);

response json_response(unsigned status, const boost::json::value& body);

// {"error": {"message", "type", "param", "code"}}; an empty `param` renders as null.
boost::json::value error_body(unsigned status, std::string_view type, std::string_view message,
                              std::string_view param = {});
response error_response(unsigned status, std::string_view type, std::string_view message,
                        std::string_view param = {});

// The `type` strings of error bodies.
inline constexpr std::string_view kInvalidRequest = "invalid_request_error";
inline constexpr std::string_view kAuthenticationError = "authentication_error";
inline constexpr std::string_view kServerError = "server_error";
inline constexpr std::string_view kUnavailableError = "service_unavailable_error";

}  // namespace hyserve::coordinator::http
