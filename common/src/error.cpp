#include "hyserve/common/error.h"

namespace hyserve {

void throw_check_failure(const char* expr, const char* file, int line, const std::string& msg) {
  throw error(std::string("check failed: ") + expr + " at " + file + ":" + std::to_string(line) +
              (msg.empty() ? std::string() : ": " + msg));
}

}  // namespace hyserve
