// The incremental detokenizer: deltas are valid UTF-8, hold back partial characters, and
// concatenate to the whole decode.
#include <gtest/gtest.h>

#include <random>

#include "hyserve/tokenizer/bpe_tokenizer.h"
#include "hyserve/tokenizer/incremental_detokenizer.h"
#include "hyserve/tokenizer/utf8.h"
#include "tokenizer_test_support.h"

namespace hyserve::tokenizer::test {
namespace {

// Streams `ids` one at a time; checks every delta and returns the concatenation.
std::string stream(const bpe_tokenizer& tok, const std::vector<int32_t>& ids, decode_options options = {}) {
  incremental_detokenizer detok(tok, options);
  std::string all;
  for (const int32_t id : ids) {
    const std::string delta = detok.push(id);
    EXPECT_TRUE(utf8_is_valid(delta)) << "delta after id " << id;
    EXPECT_LE(detok.held_bytes(), 3u);
    all += delta;
  }
  const std::string tail = detok.finish();
  EXPECT_TRUE(utf8_is_valid(tail));
  EXPECT_EQ(detok.held_bytes(), 0u);
  return all + tail;
}

TEST(IncrementalDetokenizer, ReferenceCasesMatchWholeDecode) {
  const bpe_tokenizer& tok = fixture_tokenizer();
  for (const auto& c : reference_cases()) {
    EXPECT_EQ(stream(tok, c.ids), c.decoded) << c.text;
    EXPECT_EQ(stream(tok, c.ids, {.skip_special_tokens = false}), c.text) << c.text;
  }
}

TEST(IncrementalDetokenizer, HoldsBackPartialCharacters) {
  const bpe_tokenizer& tok = fixture_tokenizer();
  const std::vector<int32_t> ids = tok.encode("🙂");  // four bytes, several tokens here
  ASSERT_GT(ids.size(), 1u);
  incremental_detokenizer detok(tok);
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    EXPECT_EQ(detok.push(ids[i]), "");
    EXPECT_GT(detok.held_bytes(), 0u);
  }
  EXPECT_EQ(detok.push(ids.back()), "🙂");
  EXPECT_EQ(detok.held_bytes(), 0u);
  EXPECT_EQ(detok.finish(), "");
}

TEST(IncrementalDetokenizer, MultiByteOutputsAcrossPlanes) {
  const bpe_tokenizer& tok = fixture_tokenizer();
  const std::vector<std::string> texts = {"héllo wörld — ñ 中文 日本語 🙂🚀", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and 𠀀𠀁", "ÿ€\u0800\uFFFD\U0010FFFF",
                                          "mixed ascii then 日本 and again ascii 🙂 end"};
  for (const auto& t : texts) EXPECT_EQ(stream(tok, tok.encode(t)), t) << t;
}

TEST(IncrementalDetokenizer, RandomIdSequencesMatchLossyDecode) {
  // Arbitrary ids make arbitrary bytes: invalid sequences become U+FFFD exactly as in decode.
  const bpe_tokenizer& tok = fixture_tokenizer();
  std::mt19937_64 rng(99);
  for (int i = 0; i < 2000; ++i) {
    std::vector<int32_t> ids(rng() % 12);
    for (auto& id : ids) id = int32_t(rng() % 512);
    EXPECT_EQ(stream(tok, ids), tok.decode(ids));
    EXPECT_EQ(stream(tok, ids, {.skip_special_tokens = false}), tok.decode(ids, {.skip_special_tokens = false}));
  }
}

TEST(IncrementalDetokenizer, IncompleteCharacterAtTheEndBecomesReplacement) {
  const bpe_tokenizer& tok = fixture_tokenizer();
  std::vector<int32_t> ids = tok.encode("ok ");
  const std::vector<int32_t> emoji = tok.encode("🙂");
  ids.push_back(emoji.front());
  incremental_detokenizer detok(tok);
  std::string out;
  for (const int32_t id : ids) out += detok.push(id);
  EXPECT_EQ(out, "ok ");
  EXPECT_EQ(detok.finish(), std::string(kReplacementChar));
  EXPECT_EQ(tok.decode(ids), "ok " + std::string(kReplacementChar));
}

TEST(IncrementalDetokenizer, SkipsSpecialTokens) {
  const bpe_tokenizer& tok = fixture_tokenizer();
  const std::vector<int32_t> ids = tok.encode("<|im_start|>assistant\nhi 🙂<|im_end|>");
  EXPECT_EQ(stream(tok, ids), "assistant\nhi 🙂");
  EXPECT_EQ(stream(tok, ids, {.skip_special_tokens = false}), "<|im_start|>assistant\nhi 🙂<|im_end|>");
}

}  // namespace
}  // namespace hyserve::tokenizer::test
