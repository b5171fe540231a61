// Row invariance of the model's forward pass on the CPU, step by step (worker::engine): a row's
// logits are the same bits
//  - in a batched TargetVerify step of D tokens as in D single-row Decode steps of the same
//    tokens (what makes speculative decoding return exactly the plain-decoding tokens);
//  - as a decode row of a Mixed step beside another request's prefill chunk, in a Decode step
//    of nine rows, and alone;
//  - as a prefill chunk alone and beside another request's chunk in one Extend step.
// f32 and bf16 (weights, KV cache; SSM state too for Bamba), Bamba and Qwen3-Next.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "fixture.h"
#include "hyserve/worker/engine.h"

namespace hyserve::test {
namespace {

using worker::engine;
using worker::forward_mode;
using worker::forward_options;
using worker::step_row;

struct row_case {
  std::string fixture;
  bool bf16 = false;
};

std::string row_case_name(const testing::TestParamInfo<row_case>& info) {
  std::string n = info.param.fixture + (info.param.bf16 ? "_bf16" : "_f32");
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
}

service_config row_config(const row_case& c) {
  std::string y = "model: {path: " + fixture_dir(c.fixture) + (c.bf16 ? ", dtype: bfloat16" : "") +
                  "}\ndevice: cpu\ncache: {page_size: 16, max_requests: 16, max_context: 512";
  if (c.bf16) y += ", kv_dtype: bfloat16";
  // Gated DeltaNet keeps its state in f32.
  if (c.bf16 && c.fixture == "bamba-tiny") y += ", ssm_state_dtype: bfloat16";
  return load_config_string(y + "}\n");
}

std::vector<int32_t> tokens(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(5 + (i * 7 + salt * 13) % 300);
  return t;
}

// Logits row r of t (all_logits) equals row s of u, bit for bit.
void expect_same_row(const host_tensor& t, int64_t r, const host_tensor& u, int64_t s, const std::string& what) {
  const int64_t V = t.shape()[1];
  ASSERT_EQ(u.shape()[1], V);
  EXPECT_EQ(std::memcmp(t.as<float>() + r * V, u.as<float>() + s * V, static_cast<size_t>(V) * sizeof(float)), 0)
      << what;
}

class RowInvariance : public testing::TestWithParam<row_case> {};

TEST_P(RowInvariance, VerifyRowsEqualDecodeStepsBitForBit) {
  engine e(row_config(GetParam()));
  forward_options all;
  all.all_logits = true;
  const std::vector<std::vector<int32_t>> drafts = {{11, 23, 35, 47}, {12, 24, 36, 48}, {13, 25, 37, 49}};
  std::vector<int32_t> req;
  for (int i = 0; i < 3; ++i) {
    req.push_back(e.open_request());
    e.step(forward_mode::kExtend, {step_row{req.back(), tokens(30 + 7 * i, i)}});
  }
  std::vector<step_row> rows;
  for (int i = 0; i < 3; ++i) rows.push_back(step_row{req[static_cast<size_t>(i)], drafts[static_cast<size_t>(i)]});
  // The verify step commits nothing: the decode steps below start from the same state.
  const host_tensor v = e.step(forward_mode::kTargetVerify, rows, all);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) {
      const host_tensor d =
          e.step(forward_mode::kDecode, {step_row{req[static_cast<size_t>(i)], {drafts[static_cast<size_t>(i)][static_cast<size_t>(j)]}}}, all);
      expect_same_row(v, i * 4 + j, d, 0, "row " + std::to_string(i) + " position " + std::to_string(j));
    }
}

TEST_P(RowInvariance, DecodeRowAloneInMixedAndInNineRowsBitForBit) {
  engine e(row_config(GetParam()));
  forward_options all;
  all.all_logits = true;
  const std::vector<int32_t> prompt = tokens(40, 1);
  auto prefilled = [&](const std::vector<int32_t>& p) {
    const int32_t h = e.open_request();
    e.step(forward_mode::kExtend, {step_row{h, p}});
    return h;
  };
  const int32_t a = prefilled(prompt);
  const host_tensor alone = e.step(forward_mode::kDecode, {step_row{a, {7}}}, all);
  e.close_request(a);

  const int32_t b = prefilled(prompt), other = e.open_request();
  const host_tensor mixed = e.step(forward_mode::kMixed, {step_row{b, {7}}, step_row{other, tokens(33, 2)}}, all);
  expect_same_row(alone, 0, mixed, 0, "decode row of a Mixed step");
  e.close_request(b);
  e.close_request(other);

  std::vector<int32_t> hs;
  std::vector<step_row> rows;
  for (int i = 0; i < 9; ++i) {
    hs.push_back(prefilled(i == 4 ? prompt : tokens(20 + i, 3 + i)));
    rows.push_back(step_row{hs.back(), {i == 4 ? 7 : 11 + i}});
  }
  const host_tensor nine = e.step(forward_mode::kDecode, rows, all);
  expect_same_row(alone, 0, nine, 4, "row 4 of nine decode rows");
  for (int32_t h : hs) e.close_request(h);
}

TEST_P(RowInvariance, PrefillChunkAloneAndBesideAnotherBitForBit) {
  engine e(row_config(GetParam()));
  forward_options all;
  all.all_logits = true;
  const std::vector<int32_t> p = tokens(40, 4);
  const int32_t a = e.open_request();
  const host_tensor alone = e.step(forward_mode::kExtend, {step_row{a, p}}, all);
  e.close_request(a);
  const int32_t b = e.open_request(), c = e.open_request();
  const host_tensor pair = e.step(forward_mode::kExtend, {step_row{c, tokens(25, 5)}, step_row{b, p}}, all);
  for (int64_t t = 0; t < 40; ++t) expect_same_row(alone, t, pair, 25 + t, "token " + std::to_string(t));
}

INSTANTIATE_TEST_SUITE_P(Cpu, RowInvariance,
                         testing::Values(row_case{"bamba-tiny", false}, row_case{"bamba-tiny", true},
                                         row_case{"qwen3next-tiny", false}, row_case{"qwen3next-tiny", true}),
                         row_case_name);

}  // namespace
}  // namespace hyserve::test
