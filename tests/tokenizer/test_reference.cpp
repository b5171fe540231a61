// The fixture tokenizer against the ids and decoded text the `tokenizers` library produced
// (reference.json): unicode, emoji, whitespace runs, code, special tokens, the empty string.
#include <gtest/gtest.h>

#include "hyserve/tokenizer/bpe_tokenizer.h"
#include "tokenizer_test_support.h"

namespace hyserve::tokenizer::test {
namespace {

class ReferenceCase : public ::testing::TestWithParam<reference_case> {};

TEST_P(ReferenceCase, EncodesToReferenceIds) {
  const reference_case& c = GetParam();
  EXPECT_EQ(fixture_tokenizer().encode(c.text), c.ids);
}

TEST_P(ReferenceCase, DecodesToReferenceText) {
  const reference_case& c = GetParam();
  // The reference decodes with skip_special_tokens, the `tokenizers` default.
  EXPECT_EQ(fixture_tokenizer().decode(c.ids), c.decoded);
}

TEST_P(ReferenceCase, DecodesBackToInputKeepingSpecialTokens) {
  const reference_case& c = GetParam();
  EXPECT_EQ(fixture_tokenizer().decode(c.ids, {.skip_special_tokens = false}), c.text);
}

std::string case_name(const ::testing::TestParamInfo<reference_case>& info) {
  std::string name = "case" + std::to_string(info.index) + "_";
  for (const char ch : info.param.text) {
    if (name.size() > 30) break;
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')) name += ch;
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Fixture, ReferenceCase, ::testing::ValuesIn(reference_cases()), case_name);

TEST(ReferenceFixture, HasTheExpectedCases) {
  const auto cases = reference_cases();
  ASSERT_GE(cases.size(), 13u);
  bool empty = false, special = false;
  for (const auto& c : cases) {
    empty |= c.text.empty();
    special |= c.text.find("<|im_start|>") != std::string::npos;
  }
  EXPECT_TRUE(empty);
  EXPECT_TRUE(special);
}

TEST(FixtureTokenizer, Metadata) {
  const bpe_tokenizer& tok = fixture_tokenizer();
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.token_to_id("<|im_start|>"), 1);
  EXPECT_EQ(tok.token_to_id("Ġ"), 223);
  EXPECT_EQ(tok.token_to_id("no such token"), std::nullopt);
  EXPECT_EQ(tok.id_to_token(1), "<|im_start|>");
  EXPECT_EQ(tok.id_to_token(223), "Ġ");
  EXPECT_EQ(tok.token_bytes(223), " ");
  EXPECT_TRUE(tok.is_special(0));
  EXPECT_FALSE(tok.is_special(223));
  EXPECT_FALSE(tok.is_known(-1));
  EXPECT_FALSE(tok.is_known(512));
  EXPECT_TRUE(tok.template_prefix().empty());
  EXPECT_TRUE(tok.template_suffix().empty());
}

TEST(FixtureTokenizer, SpecialTokensCanBeTreatedAsText) {
  const bpe_tokenizer& tok = fixture_tokenizer();
  const std::string text = "<|im_start|>user";
  const std::vector<int32_t> as_text = tok.encode(text, {.match_special_tokens = false});
  for (const int32_t id : as_text) EXPECT_FALSE(tok.is_special(id));
  EXPECT_GT(as_text.size(), 2u);
  EXPECT_EQ(tok.decode(as_text), text);
}

TEST(FixtureTokenizer, DecodeSkipsUnknownIds) {
  const bpe_tokenizer& tok = fixture_tokenizer();
  const std::vector<int32_t> ids = {42, -5, 71, 100000, 78};
  EXPECT_EQ(tok.decode(ids), tok.decode(std::vector<int32_t>{42, 71, 78}));
}

TEST(FixtureTokenizer, InvalidUtf8InputIsRejected) {
  EXPECT_THROW(fixture_tokenizer().encode("abc\xff"), hyserve::invalid_argument_error);
  EXPECT_THROW(fixture_tokenizer().encode("\xed\xa0\x80"), hyserve::invalid_argument_error);  // surrogate
}

TEST(FixtureTokenizer, DecodeReplacesInvalidUtf8) {
  const bpe_tokenizer& tok = fixture_tokenizer();
  // The first byte of a 3-byte character alone, then 'a': one U+FFFD, then the letter.
  const std::vector<int32_t> e4 = tok.encode("中");
  ASSERT_GE(e4.size(), 2u);
  std::vector<int32_t> ids = {e4[0]};
  for (const int32_t id : tok.encode("a")) ids.push_back(id);
  EXPECT_EQ(tok.decode(ids), "\xEF\xBF\xBD" "a");
}

TEST(FixtureTokenizer, PreTokenizeFollowsTheGpt2Pattern) {
  EXPECT_EQ(fixture_tokenizer().pre_tokenize("Hello world  foo's 123!!\n\n"),
            (std::vector<std::string>{"Hello", " world", " ", " foo", "'s", " 123", "!!", "\n\n"}));
  EXPECT_EQ(fixture_tokenizer().pre_tokenize("a<|im_end|>b"), (std::vector<std::string>{"a", "b"}));
}

}  // namespace
}  // namespace hyserve::tokenizer::test
