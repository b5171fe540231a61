#include "coordinator/api/api_error.h"

namespace hyserve::coordinator::api {

api_error invalid_param(std::string param, std::string message) {
  api_error e;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

http::response to_response(const api_error& e) { return http::error_response(e.status, e.type, e.message, e.param); }

}  // namespace hyserve::coordinator::api
