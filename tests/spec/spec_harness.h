#pragma once
// In-process service for speculative-decoding tests: the service's scheduler drives a real plan
// runner (tp = 1) through a transport that executes each plan synchronously, with every plan
// and result going through the wire encoding (coordinator/local_service.h).
#include <chrono>
#include <vector>

#include "coordinator/local_service.h"
#include "hyserve/common/config.h"

namespace hyserve::test {

using local_transport = coordinator::local_transport;
using generation = coordinator::local_generation;
using gen_request = coordinator::local_request;
using submitted_requests = coordinator::local_batch;

// Submits every request at once (they share batches), runs until all finished. Once per
// service: stopping the scheduler drains it, so later submissions are aborted.
class spec_service {
 public:
  explicit spec_service(const service_config& cfg) : svc_(cfg) {}
  const model_config& config() const { return svc_.config(); }
  local_transport& link() { return svc_.link(); }
  std::vector<generation> run(const std::vector<gen_request>& reqs) { return svc_.run(reqs, std::chrono::minutes(10)); }

 private:
  coordinator::local_service svc_;
};

}  // namespace hyserve::test
