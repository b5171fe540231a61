// Every hybrid family against its Hugging Face reference (tests/fixtures/<fixture>, float32,
// CPU): teacher-forced logits, per-layer hidden states of prompt 0, greedy continuations, verify
// steps, chunked prefill and batched Extend / Decode / Mixed, all within the issue contract.
// Fixtures: bamba-tiny (1 B/C group), bamba-groups (4 groups, per-group gated norm),
// qwen3next-tiny (Gated DeltaNet + gated attention, MoE), nemotronh-tiny (Mamba2 / attention /
// relu² MLP layers, 4 groups), granite4h-tiny (Mamba2 + attention, 4 experts top 2 + shared MLP,
// muP multipliers, no positional embedding, tied embeddings), falconh1-tiny (parallel attention
// + Mamba2 in every layer, muP multipliers, norm before gate, 2 groups).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "fixture.h"
#include "hyserve/common/config.h"
#include "hyserve/common/error.h"
#include "hyserve/common/safetensors.h"
#include "hyserve/worker/collective.h"
#include "hyserve/worker/model.h"
#include "hyserve/worker/engine.h"

namespace hyserve {
namespace {

using worker::engine;
using worker::forward_mode;
using worker::forward_options;
using worker::step_row;

constexpr float kLogitTol = 2e-4f;   // issue contract: max abs vs full_logits
constexpr float kHiddenTol = 2e-4f;  // issue contract: max abs vs hidden.0.{l}

const char* const kFixtures[] = {"bamba-tiny",     "bamba-groups",   "qwen3next-tiny",
                                  "nemotronh-tiny", "granite4h-tiny", "falconh1-tiny"};

// The reference of one fixture, loaded once per fixture.
struct fixture_data {
  std::vector<test::reference_prompt> prompts;
  std::unique_ptr<safetensors_file> ref;
  int64_t layers = 0;
};

const fixture_data& fixture(const std::string& name) {
  static std::map<std::string, std::unique_ptr<fixture_data>> cache;
  auto& slot = cache[name];
  if (!slot) {
    slot = std::make_unique<fixture_data>();
    slot->prompts = test::load_reference_prompts(name);
    slot->ref = std::make_unique<safetensors_file>(
        safetensors_file::open(test::fixture_dir(name) + "/reference.safetensors"));
    service_config cfg;
    cfg.model.path = test::fixture_dir(name);
    slot->layers = resolve_model_config(cfg).num_layers;
  }
  return *slot;
}

std::string fixture_name(const std::string& f) {
  std::string s;
  for (char c : f) s += (c == '-') ? '_' : c;
  return s;
}

// Fixture-parameterised base: GetFixture() names the fixture of the running test.
class ParityBase {
 protected:
  virtual ~ParityBase() = default;
  virtual std::string fixture_id() const = 0;

  std::unique_ptr<engine> make_engine() const {
    service_config cfg;
    cfg.model.path = test::fixture_dir(fixture_id());
    cfg.cache.page_size = 16;
    cfg.cache.max_requests = 8;
    cfg.cache.max_context = 256;
    return std::make_unique<engine>(cfg);
  }

  const std::vector<test::reference_prompt>& prompts() const { return fixture(fixture_id()).prompts; }
  const safetensors_file& ref() const { return *fixture(fixture_id()).ref; }

  std::vector<int32_t> full_sequence(size_t i) const {
    std::vector<int32_t> s = prompts()[i].input_ids;
    s.insert(s.end(), prompts()[i].greedy_ids.begin(), prompts()[i].greedy_ids.end());
    return s;
  }

  // Reference logits row for position t of prompt i (teacher forced over prompt + greedy).
  const float* ref_row(size_t i, int64_t t) const {
    return static_cast<const float*>(ref().data("full_logits." + std::to_string(i))) + t * kVocab;
  }

  static constexpr int64_t kVocab = 512;
};

class Parity : public ParityBase, public ::testing::TestWithParam<const char*> {
 protected:
  std::string fixture_id() const override { return GetParam(); }
};

TEST_P(Parity, TeacherForcedLogitsMatchReference) {
  auto eng = make_engine();
  float worst = 0.0f;
  forward_options opts;
  opts.all_logits = true;
  for (size_t i = 0; i < prompts().size(); ++i) {
    const std::vector<int32_t> seq = full_sequence(i);
    ASSERT_EQ(ref().info("full_logits." + std::to_string(i)).shape, shape_t({static_cast<int64_t>(seq.size()), kVocab}));
    const int32_t req = eng->open_request();
    const host_tensor logits = eng->step(forward_mode::kExtend, {step_row{req, seq}}, opts);
    eng->close_request(req);
    ASSERT_EQ(logits.shape(), shape_t({static_cast<int64_t>(seq.size()), kVocab}));
    const float diff = test::max_abs_diff(logits.as<float>(), ref_row(i, 0), logits.numel());
    EXPECT_LE(diff, kLogitTol) << "prompt " << i;
    worst = std::max(worst, diff);
  }
  std::printf("%s: teacher-forced logits max |diff| %.3g\n", fixture_id().c_str(), worst);
}

TEST_P(Parity, HiddenStatesOfPromptZeroMatchReference) {
  auto eng = make_engine();
  std::vector<host_tensor> hidden;
  forward_options opts;
  opts.all_logits = true;
  opts.hidden_states = &hidden;
  const std::vector<int32_t>& prompt = prompts()[0].input_ids;
  const int32_t req = eng->open_request();
  eng->step(forward_mode::kExtend, {step_row{req, prompt}}, opts);
  // Reference: hidden.0.0 = embeddings, hidden.0.l = output of layer l-1, and the last entry is
  // the final-normed output (transformers replaces the last layer's output by it).
  const int64_t layers = fixture(fixture_id()).layers;
  ASSERT_EQ(hidden.size(), static_cast<size_t>(layers + 2));
  float worst = 0.0f;
  for (int64_t l = 0; l <= layers; ++l) {
    const std::string name = "hidden.0." + std::to_string(l);
    const tensor_info& info = ref().info(name);
    const host_tensor& mine = (l == layers) ? hidden.back() : hidden[static_cast<size_t>(l)];
    ASSERT_EQ(info.shape, mine.shape()) << name;
    const float diff =
        test::max_abs_diff(mine.as<float>(), static_cast<const float*>(ref().data(name)), mine.numel());
    EXPECT_LE(diff, kHiddenTol) << name;
    worst = std::max(worst, diff);
  }
  std::printf("%s: hidden states of prompt 0 max |diff| %.3g\n", fixture_id().c_str(), worst);
}

TEST_P(Parity, GreedyGenerationReproducesReference) {
  auto eng = make_engine();
  for (size_t i = 0; i < prompts().size(); ++i) {
    const auto& p = prompts()[i];
    EXPECT_EQ(eng->generate_greedy(p.input_ids, static_cast<int32_t>(p.greedy_ids.size())), p.greedy_ids)
        << "prompt " << i;
  }
}

// A TargetVerify step through the engine (the last prompt token and the next 4 reference tokens
// as drafts) gives the teacher-forced logits of those positions (the reference's, within the
// contract's tolerance) and commits nothing: the verify runs twice with the same result, and a
// following Extend of the same tokens still matches the reference (the cache and the recurrent
// state are those of the prompt alone).
TEST_P(Parity, VerifyStepGivesTeacherForcedLogitsAndCommitsNothing) {
  auto eng = make_engine();
  constexpr int32_t kWidth = 5;
  int checked = 0;
  for (size_t i = 0; i < prompts().size(); ++i) {
    const std::vector<int32_t> seq = full_sequence(i);
    const auto p0 = static_cast<int64_t>(prompts()[i].input_ids.size());
    if (static_cast<int64_t>(seq.size()) < p0 + kWidth) continue;
    const int32_t req = eng->open_request();
    eng->step(forward_mode::kExtend, {step_row{req, std::vector<int32_t>(seq.begin(), seq.begin() + p0 - 1)}});
    const std::vector<int32_t> window(seq.begin() + p0 - 1, seq.begin() + p0 - 1 + kWidth);
    for (int pass = 0; pass < 2; ++pass) {
      const host_tensor logits = eng->step(forward_mode::kTargetVerify, {step_row{req, window}});
      ASSERT_EQ(logits.shape(), shape_t({kWidth, kVocab})) << "prompt " << i;
      EXPECT_EQ(eng->cached_len(req), p0 - 1) << "prompt " << i << ": a verify step commits nothing";
      const float diff = test::max_abs_diff(logits.as<float>(), ref_row(i, p0 - 1), logits.numel());
      EXPECT_LE(diff, kLogitTol) << "prompt " << i << " pass " << pass;
    }
    forward_options opts;
    opts.all_logits = true;
    const host_tensor after = eng->step(forward_mode::kExtend, {step_row{req, window}}, opts);
    EXPECT_LE(test::max_abs_diff(after.as<float>(), ref_row(i, p0 - 1), after.numel()), kLogitTol) << "prompt " << i;
    eng->close_request(req);
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

class Chunked : public ParityBase, public ::testing::TestWithParam<std::tuple<const char*, int32_t>> {
 protected:
  std::string fixture_id() const override { return std::get<0>(GetParam()); }
};

TEST_P(Chunked, ChunkedExtendEqualsWholeExtend) {
  const int32_t chunk = std::get<1>(GetParam());
  auto eng = make_engine();
  forward_options opts;
  opts.all_logits = true;
  for (size_t i = 0; i < prompts().size(); ++i) {
    const std::vector<int32_t> seq = full_sequence(i);
    const int32_t req = eng->open_request();
    const host_tensor whole = [&] {
      auto other = make_engine();
      const int32_t r = other->open_request();
      return other->step(forward_mode::kExtend, {step_row{r, seq}}, opts);
    }();
    for (size_t at = 0; at < seq.size(); at += static_cast<size_t>(chunk)) {
      const size_t n = std::min(static_cast<size_t>(chunk), seq.size() - at);
      const std::vector<int32_t> piece(seq.begin() + static_cast<std::ptrdiff_t>(at),
                                       seq.begin() + static_cast<std::ptrdiff_t>(at + n));
      const host_tensor logits = eng->step(forward_mode::kExtend, {step_row{req, piece}}, opts);
      ASSERT_EQ(logits.shape()[0], static_cast<int64_t>(n));
      const int64_t t0 = static_cast<int64_t>(at);
      EXPECT_LE(test::max_abs_diff(logits.as<float>(), ref_row(i, t0), logits.numel()), kLogitTol)
          << "prompt " << i << " chunk at " << at;
      EXPECT_LE(test::max_abs_diff(logits.as<float>(), whole.as<float>() + t0 * kVocab, logits.numel()), kLogitTol)
          << "prompt " << i << " chunk at " << at << " vs whole-prompt extend";
    }
    eng->close_request(req);
  }
}

std::string chunk_name(const ::testing::TestParamInfo<std::tuple<const char*, int32_t>>& info) {
  return fixture_name(std::get<0>(info.param)) + "_chunk" + std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(ChunkSizes, Chunked, ::testing::Combine(::testing::ValuesIn(kFixtures), ::testing::Values(1, 5, 16, 17)),
                         chunk_name);
// 64 and 65 straddle the GDN chunk size: the 74-token sequence of qwen3next-tiny's prompt 2 is
// split into a full chunk plus a continued prefill that starts from the saved state.
INSTANTIATE_TEST_SUITE_P(GdnChunkSizes, Chunked,
                         ::testing::Combine(::testing::Values("qwen3next-tiny"), ::testing::Values(64, 65)), chunk_name);

// All three prompts in one engine: an Extend batch (prompt 2 only half), Decode batches, then a
// Mixed batch that finishes prompt 2's prefill while 0 and 1 decode, then Decode to the end.
// Each row's logits must equal the reference teacher-forced row for its position.
TEST_P(Parity, BatchedExtendDecodeMixedEqualOneAtATime) {
  auto eng = make_engine();
  const size_t n = prompts().size();
  std::vector<int32_t> req(n);
  std::vector<std::vector<int32_t>> seq(n);
  std::vector<size_t> consumed(n, 0);
  for (size_t i = 0; i < n; ++i) {
    req[i] = eng->open_request();
    seq[i] = full_sequence(i);
  }
  auto check_rows = [&](const host_tensor& logits, const std::vector<size_t>& which, const std::string& what) {
    ASSERT_EQ(logits.shape()[0], static_cast<int64_t>(which.size())) << what;
    for (size_t r = 0; r < which.size(); ++r) {
      const size_t i = which[r];
      const int64_t pos = static_cast<int64_t>(consumed[i]) - 1;  // last token consumed
      EXPECT_LE(test::max_abs_diff(logits.as<float>() + static_cast<int64_t>(r) * kVocab, ref_row(i, pos), kVocab),
                kLogitTol)
          << what << ": prompt " << i << " position " << pos;
    }
  };
  auto take = [&](size_t i, size_t count) {
    std::vector<int32_t> t(seq[i].begin() + static_cast<std::ptrdiff_t>(consumed[i]),
                           seq[i].begin() + static_cast<std::ptrdiff_t>(consumed[i] + count));
    consumed[i] += count;
    return t;
  };

  const size_t half = prompts()[2].input_ids.size() / 2;
  {
    std::vector<step_row> rows = {{req[0], take(0, prompts()[0].input_ids.size())},
                                  {req[1], take(1, prompts()[1].input_ids.size())},
                                  {req[2], take(2, half)}};
    check_rows(eng->step(forward_mode::kExtend, rows), {0, 1, 2}, "extend batch");
  }
  for (int s = 0; s < 3; ++s) {
    std::vector<step_row> rows = {{req[0], take(0, 1)}, {req[1], take(1, 1)}};
    check_rows(eng->step(forward_mode::kDecode, rows), {0, 1}, "decode batch " + std::to_string(s));
  }
  {
    const size_t rest = prompts()[2].input_ids.size() - half;
    std::vector<step_row> rows = {{req[0], take(0, 1)}, {req[2], take(2, rest)}, {req[1], take(1, 1)}};
    check_rows(eng->step(forward_mode::kMixed, rows), {0, 2, 1}, "mixed batch");
  }
  while (true) {
    std::vector<step_row> rows;
    std::vector<size_t> which;
    for (size_t i = 0; i < n; ++i)
      if (consumed[i] < seq[i].size()) {
        rows.push_back({req[i], take(i, 1)});
        which.push_back(i);
      }
    if (rows.empty()) break;
    check_rows(eng->step(forward_mode::kDecode, rows), which, "decode tail");
  }
}

TEST_P(Parity, TokenOutsideVocabularyIsAClearError) {
  auto eng = make_engine();
  const int32_t req = eng->open_request();
  try {
    eng->step(forward_mode::kExtend, {step_row{req, {1, 2, 512}}});
    FAIL() << "expected an error";
  } catch (const invalid_argument_error& e) {
    EXPECT_NE(std::string(e.what()).find("512"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("vocabulary"), std::string::npos) << e.what();
  }
  // The engine is still usable afterwards.
  const auto& p = prompts()[0];
  EXPECT_EQ(eng->generate_greedy(p.input_ids, 4),
            std::vector<int32_t>(p.greedy_ids.begin(), p.greedy_ids.begin() + 4));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity, ::testing::ValuesIn(kFixtures),
                         [](const auto& test_info) { return fixture_name(test_info.param); });

TEST_P(Parity, IdleStepHasNoRows) {
  auto eng = make_engine();
  const host_tensor logits = eng->step(forward_mode::kIdle, {});
  EXPECT_EQ(logits.shape(), shape_t({0, kVocab}));
}

// Key-head groups split whole: 2 key heads over 4 ranks is a start-up error naming the dimension.
TEST(Qwen3NextStartup, UnsupportedTensorParallelSplitNamesTheDimension) {
  service_config cfg;
  cfg.model.path = test::fixture_dir("qwen3next-tiny");
  const model_config mc = resolve_model_config(cfg);
  auto comm = worker::make_local_collective();
  try {
    worker::make_model(cfg, mc, worker::tp_placement{0, 4}, comm.get());
    FAIL() << "expected a start-up error";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_num_key_heads = 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hyserve
