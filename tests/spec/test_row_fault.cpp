// The worker checks every row's sampling settings before the step and fails only the row it
// cannot sample (the coordinator's API validation normally stops such values first; this drives
// the scheduler and the plan runner directly, in one process, with the wire encoding between).
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "fixture.h"
#include "spec_harness.h"

namespace hyserve::test {
namespace {

service_config row_fault_config(const std::string& speculative) {
  return load_config_string("model: {path: " + fixture_dir("bamba-tiny") +
                            "}\n"
                            "cache: {page_size: 16, max_requests: 16, max_context: 512}\n"
                            "scheduler: {max_batch_tokens: 512, max_running: 16, chunked_prefill: 64}\n" +
                            speculative);
}

TEST(RowFault, BadSamplingValueFailsOnlyItsRow) {
  const auto prompts = load_reference_prompts("bamba-tiny");
  ASSERT_EQ(prompts.size(), 3u);
  for (const std::string& spec : {std::string(), std::string("speculative: {algorithm: ngram, cost_check: false}\n")}) {
    SCOPED_TRACE(spec.empty() ? "plain" : "ngram");
    std::vector<gen_request> reqs(7);
    for (size_t i = 0; i < reqs.size(); ++i) {
      reqs[i].prompt = prompts[i % 3].input_ids;
      reqs[i].sampling.max_new_tokens = static_cast<int32_t>(prompts[i % 3].greedy_ids.size());
      reqs[i].sampling.ignore_eos = true;
    }
    reqs[2].sampling.temperature = std::numeric_limits<float>::infinity();
    reqs[5].sampling.top_p = 0.0f;
    spec_service svc(row_fault_config(spec));
    const std::vector<generation> got = svc.run(reqs);
    for (size_t i = 0; i < got.size(); ++i) {
      if (i == 2 || i == 5) {
        ASSERT_TRUE(got[i].error.has_value()) << "request " << i << " should fail";
        EXPECT_NE(got[i].error->find(i == 2 ? "temperature" : "top_p"), std::string::npos) << *got[i].error;
        EXPECT_NE(got[i].error->find("worker error"), std::string::npos) << *got[i].error;
      } else {
        EXPECT_FALSE(got[i].error.has_value()) << "request " << i << ": " << got[i].error.value_or("");
        EXPECT_EQ(got[i].output, prompts[i % 3].greedy_ids) << "request " << i;
      }
    }
  }
}

}  // namespace
}  // namespace hyserve::test
