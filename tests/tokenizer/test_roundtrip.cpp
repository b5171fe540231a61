// decode(encode(s)) == s for random UTF-8: code points from every plane (no surrogates),
// whitespace runs, and special-token text embedded whole or in pieces.
#include <gtest/gtest.h>

#include <array>
#include <random>

#include "hyserve/tokenizer/bpe_tokenizer.h"
#include "hyserve/tokenizer/utf8.h"
#include "tokenizer_test_support.h"

namespace hyserve::tokenizer::test {
namespace {

char32_t random_code_point(std::mt19937_64& rng) {
  switch (rng() % 8) {
    case 0:
    case 1:
    case 2: return char32_t(0x20 + rng() % 0x5F);   // printable ASCII
    case 3: return char32_t(rng() % 0x80);          // any ASCII, controls included
    case 4: return char32_t(0x80 + rng() % 0x780);  // two-byte
    case 5: {                                       // three-byte, no surrogates
      char32_t c;
      do c = char32_t(0x800 + rng() % (0x10000 - 0x800));
      while (c >= 0xD800 && c <= 0xDFFF);
      return c;
    }
    case 6: return char32_t(0x10000 + rng() % 0x10000);     // plane 1 (emoji)
    default: return char32_t(0x20000 + rng() % 0xF0000);    // planes 2-16
  }
}

std::string random_text(std::mt19937_64& rng) {
  static constexpr std::array<std::string_view, 9> kWhitespace = {" ", "  ", "\t", "\n", "\r\n", "\u00A0", "\u3000", "\u2028", "\v"};
  static constexpr std::array<std::string_view, 6> kSpecial = {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_", "|>", "<|"};
  static constexpr std::array<std::string_view, 6> kWords = {"hello", "the", "don't", "1234567", "self", "'s"};
  std::string s;
  const int chunks = int(rng() % 24);
  for (int i = 0; i < chunks; ++i) {
    const unsigned r = unsigned(rng() % 10);
    if (r < 5) {
      const int n = 1 + int(rng() % 6);
      for (int k = 0; k < n; ++k) utf8_append_code_point(random_code_point(rng), s);
    } else if (r < 7) {
      const int n = 1 + int(rng() % 5);
      for (int k = 0; k < n; ++k) s += kWhitespace[rng() % kWhitespace.size()];
    } else if (r < 8) {
      s += kSpecial[rng() % kSpecial.size()];
    } else {
      s += kWords[rng() % kWords.size()];
    }
  }
  return s;
}

TEST(RoundTrip, RandomUtf8_10000Strings) {
  const bpe_tokenizer& tok = fixture_tokenizer();
  std::mt19937_64 rng(0x5eed1234);
  for (int i = 0; i < 10000; ++i) {
    const std::string s = random_text(rng);
    ASSERT_TRUE(utf8_is_valid(s));
    const std::vector<int32_t> ids = tok.encode(s);
    for (const int32_t id : ids) ASSERT_TRUE(tok.is_known(id)) << "string " << i;
    ASSERT_EQ(tok.decode(ids, {.skip_special_tokens = false}), s) << "string " << i;
  }
}

TEST(RoundTrip, RandomUtf8WithSpecialTokensAsText) {
  const bpe_tokenizer& tok = fixture_tokenizer();
  std::mt19937_64 rng(0xabcdef);
  for (int i = 0; i < 2000; ++i) {
    const std::string s = random_text(rng);
    const std::vector<int32_t> ids = tok.encode(s, {.match_special_tokens = false});
    for (const int32_t id : ids) ASSERT_FALSE(tok.is_special(id)) << "string " << i;
    ASSERT_EQ(tok.decode(ids), s) << "string " << i;
  }
}

TEST(RoundTrip, LongRunsOfOneClass) {
  // Long words and whitespace runs go through the merge loop uncached and through the
  // lookahead of \s+(?!\S).
  const bpe_tokenizer& tok = fixture_tokenizer();
  for (const std::string unit : {"a", " ", "\n", "中", "🙂", "1", "!", "  x"}) {
    std::string s;
    for (int i = 0; i < 20000; ++i) s += unit;
    EXPECT_EQ(tok.decode(tok.encode(s)), s) << "unit " << unit;
  }
}

TEST(RoundTrip, EncodeIsDeterministicAcrossCacheStates) {
  // The same words encoded cold and then from the word cache give the same ids.
  const bpe_tokenizer fresh = bpe_tokenizer::from_file(fixture_path("tokenizer.json"));
  std::mt19937_64 rng(7);
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back(random_text(rng));
  std::vector<std::vector<int32_t>> first;
  for (const auto& t : texts) first.push_back(fresh.encode(t));
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(fresh.encode(texts[i]), first[i]);
}

}  // namespace
}  // namespace hyserve::tokenizer::test
