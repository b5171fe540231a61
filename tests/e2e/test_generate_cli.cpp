// hyserve-generate as a user runs it: a real process, its stdout parsed as JSON.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>
#include <sys/wait.h>

#include "fixture.h"

namespace hyserve {
namespace {

struct run_result {
  int exit_code = -1;
  std::string out;
};

run_result run(const std::string& args) {
  const std::string cmd = std::string(HYSERVE_BINARY_DIR) + "/bin/hyserve-generate " + args + " 2>&1";
  run_result r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 65536> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string join(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

TEST(GenerateCli, PrintsReferenceGreedyIdsForEveryFixturePrompt) {
  const auto prompts = test::load_reference_prompts("bamba-tiny");
  for (size_t i = 0; i < prompts.size(); ++i) {
    const run_result r = run("--model " + test::fixture_dir("bamba-tiny") + " --input-ids " +
                             join(prompts[i].input_ids) + " --max-new-tokens 24 --json");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const boost::json::value v = boost::json::parse(r.out);
    EXPECT_EQ(boost::json::value_to<std::vector<int32_t>>(v.at("output_ids")), prompts[i].greedy_ids)
        << "prompt " << i;
  }
}

TEST(GenerateCli, LogitsRowsMatchTeacherForcedReference) {
  const auto prompts = test::load_reference_prompts("bamba-tiny");
  const run_result r = run("--model " + test::fixture_dir("bamba-tiny") + " --input-ids " +
                           join(prompts[0].input_ids) + " --max-new-tokens 24 --json --logits");
  ASSERT_EQ(r.exit_code, 0) << r.out.substr(0, 500);
  const boost::json::value v = boost::json::parse(r.out);
  const auto rows = boost::json::value_to<std::vector<std::vector<float>>>(v.at("logits"));
  ASSERT_EQ(rows.size(), prompts[0].input_ids.size() + 24);
  const safetensors_file ref = safetensors_file::open(test::fixture_dir("bamba-tiny") + "/reference.safetensors");
  const float* full = static_cast<const float*>(ref.data("full_logits.0"));
  for (size_t t = 0; t < rows.size(); ++t) {
    ASSERT_EQ(rows[t].size(), 512u);
    EXPECT_LE(test::max_abs_diff(rows[t].data(), full + t * 512, 512), 2e-4f) << "row " << t;
  }
}

TEST(GenerateCli, BadInputIsAClearErrorNotACrash) {
  const std::string model = "--model " + test::fixture_dir("bamba-tiny");
  run_result r = run(model + " --input-ids 1,2,9999 --max-new-tokens 2");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("9999"), std::string::npos) << r.out;
  r = run(model + " --input-ids 1,x --max-new-tokens 2");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--input-ids"), std::string::npos) << r.out;
  r = run("--model /nonexistent/dir --input-ids 1 --max-new-tokens 2");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("/nonexistent/dir"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace hyserve
