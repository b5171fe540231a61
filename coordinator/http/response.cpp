#include "coordinator/http/response.h"

#include <charconv>
#include <cmath>

#include <boost/json.hpp>

namespace hyserve::coordinator::http {
namespace {

void append_json(std::string& out, const boost::json::value& v) {
  switch (v.kind()) {
    case boost::json::kind::object: {
      out += '{';
      bool first = true;
      for (const auto& kv : v.get_object()) {
        if (!first) out += ',';
        first = false;
        out += boost::json::serialize(boost::json::string_view(kv.key()));
        out += ':';
        append_json(out, kv.value());
      }
      out += '}';
      return;
    }
    case boost::json::kind::array: {
      out += '[';
      bool first = true;
      for (const auto& e : v.get_array()) {
        if (!first) out += ',';
        first = false;
        append_json(out, e);
      }
      out += ']';
      return;
    }
    case boost::json::kind::double_: {
      const double d = v.get_double();
      if (!std::isfinite(d)) {  // JSON has no infinity or NaN
        out += "null";
        return;
      }
      // The shortest digits that read back as the same double, in plain decimal notation.
      char buf[400];
      const auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::fixed);
      if (r.ec != std::errc()) {
        out += boost::json::serialize(v);
        return;
      }
      out.append(buf, r.ptr);
      return;
    }
    default:
      out += boost::json::serialize(v);
      return;
  }
}

}  // namespace

std::string json_text(const boost::json::value& v) {
  std::string out;
  append_json(out, v);
  return out;
}

response json_response(unsigned status, const boost::json::value& body) {
  response res;
  res.status = status;
  res.body = json_text(body);
  return res;
}

boost::json::value error_body(unsigned status, std::string_view type, std::string_view message,
                              std::string_view param) {
  boost::json::object error;
  error["message"] = message;
  error["type"] = type;
  if (param.empty()) {
    error["param"] = nullptr;
  } else {
    error["param"] = param;
  }
  error["code"] = status;
  boost::json::object body;
  body["error"] = std::move(error);
  return body;
}

response error_response(unsigned status, std::string_view type, std::string_view message,
                        std::string_view param) {
  return json_response(status, error_body(status, type, message, param));
}

}  // namespace hyserve::coordinator::http
