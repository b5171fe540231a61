#pragma once
// A request the API refuses: an expected failure, carried as a value up to the handler, which
// answers it as {"error": {"message", "type", "param", "code"}}.
#include <string>
#include <variant>

#include "coordinator/http/response.h"

namespace hyserve::coordinator::api {

struct api_error {
  unsigned status = 400;
  std::string message;
  std::string param;  // field path ("sampling_params.top_p"); empty when no field is at fault
  std::string type = std::string(http::kInvalidRequest);
};

// A 400 invalid_request_error naming `param`.
api_error invalid_param(std::string param, std::string message);

http::response to_response(const api_error& e);

// The result of parsing and validating a request body.
template <class T>
using parse_result = std::variant<T, api_error>;

}  // namespace hyserve::coordinator::api
