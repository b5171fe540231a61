#include "coordinator/http/response.h"

#include <boost/json.hpp>

namespace hyserve::coordinator::http {

response json_response(unsigned status, const boost::json::value& body) {
  response res;
  res.status = status;
  res.body = boost::json::serialize(body);
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
