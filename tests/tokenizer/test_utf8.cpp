// UTF-8 helpers: validity per Unicode Table 3-7 and maximal-subpart replacement.
#include <gtest/gtest.h>

#include "hyserve/tokenizer/utf8.h"

namespace hyserve::tokenizer {
namespace {

const std::string kFffd(kReplacementChar);

TEST(Utf8, Validity) {
  EXPECT_TRUE(utf8_is_valid(""));
  EXPECT_TRUE(utf8_is_valid("plain ascii text that is longer than eight bytes"));
  EXPECT_TRUE(utf8_is_valid("é中🙂\U0010FFFF"));
  EXPECT_FALSE(utf8_is_valid("\xC0\x80"));          // overlong
  EXPECT_FALSE(utf8_is_valid("\xE0\x80\x80"));      // overlong
  EXPECT_FALSE(utf8_is_valid("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(utf8_is_valid("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(utf8_is_valid("\xF0\x9F\x99"));      // truncated
  EXPECT_EQ(utf8_valid_prefix("abcdefghij\xFFxyz"), 10u);
}

TEST(Utf8, LossyUsesMaximalSubparts) {
  std::string out;
  utf8_append_lossy("a\xF0\x9F\x99" "b", out);  // truncated 4-byte sequence: one replacement
  EXPECT_EQ(out, "a" + kFffd + "b");
  out.clear();
  utf8_append_lossy("\xED\xA0\x80", out);  // surrogate: each byte is its own subpart
  EXPECT_EQ(out, kFffd + kFffd + kFffd);
  out.clear();
  utf8_append_lossy("\xC3", out);
  EXPECT_EQ(out, kFffd);
}

TEST(Utf8, IncompleteTail) {
  EXPECT_EQ(utf8_incomplete_tail("abc"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("ab\xE4"), 1u);
  EXPECT_EQ(utf8_incomplete_tail("ab\xE4\xB8"), 2u);
  EXPECT_EQ(utf8_incomplete_tail("ab\xE4\xB8\xAD"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\x99"), 3u);
  EXPECT_EQ(utf8_incomplete_tail("\xED\xA0"), 0u);  // can never complete
  EXPECT_EQ(utf8_incomplete_tail("\x80\x80"), 0u);
}

}  // namespace
}  // namespace hyserve::tokenizer
