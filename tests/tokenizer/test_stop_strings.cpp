// Stop strings over streamed text, including stops split across token boundaries.
#include <gtest/gtest.h>

#include "hyserve/tokenizer/bpe_tokenizer.h"
#include "hyserve/tokenizer/incremental_detokenizer.h"
#include "hyserve/tokenizer/stop_string_matcher.h"
#include "tokenizer_test_support.h"

namespace hyserve::tokenizer::test {
namespace {

// Feeds `deltas`; returns what was emitted and whether/which stop fired.
struct run_result {
  std::string text;
  bool stopped = false;
  size_t stop_index = 0;
};

run_result run(std::vector<std::string> stops, const std::vector<std::string>& deltas) {
  stop_string_matcher m(std::move(stops));
  run_result out;
  for (const auto& d : deltas) {
    const auto r = m.push(d);
    out.text += r.text;
    if (r.stopped) {
      out.stopped = true;
      out.stop_index = r.stop_index;
      return out;
    }
  }
  out.text += m.finish();
  return out;
}

TEST(StopStringMatcher, NoStopPassesEverythingThrough) {
  const auto r = run({"STOP"}, {"hello ", "world"});
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.text, "hello world");
}

TEST(StopStringMatcher, StopInsideOneDelta) {
  const auto r = run({"STOP"}, {"abc STOP def"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "abc ");
}

TEST(StopStringMatcher, StopAcrossDeltas) {
  const auto r = run({"\nUser:"}, {"answer", "\n", "Us", "er", ": more"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "answer");
}

TEST(StopStringMatcher, HoldsBackPossiblePrefixThenReleasesIt) {
  stop_string_matcher m({"</s>"});
  auto r = m.push("text </");
  EXPECT_EQ(r.text, "text ");
  EXPECT_EQ(m.held(), "</");
  r = m.push("b>");  // not the stop after all
  EXPECT_EQ(r.text, "</b>");
  EXPECT_FALSE(r.stopped);
  r = m.push("<");
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(m.finish(), "<");
}

TEST(StopStringMatcher, EarliestStopWinsAndReportsItsIndex) {
  const auto r = run({"world", "lo w", "xyz"}, {"hel", "lo world"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.stop_index, 1u);
  EXPECT_EQ(r.text, "hel");
}

TEST(StopStringMatcher, OverlappingPrefixes) {
  // "aab" inside "aaab": the held suffix must restart correctly.
  const auto r = run({"aab"}, {"a", "a", "a", "b", "c"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "a");
}

TEST(StopStringMatcher, EmptyStopStringsAreIgnored) {
  const auto r = run({"", "zz"}, {"abc"});
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.text, "abc");
}

TEST(StopStringMatcher, AfterStopNothingMore) {
  stop_string_matcher m({"."});
  EXPECT_TRUE(m.push("end. more").stopped);
  const auto r = m.push("again");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(m.finish(), "");
}

TEST(StopStringMatcher, MultiByteStopString) {
  const auto r = run({"🙂!"}, {"smile 🙂", "?", " again 🙂", "!", " tail"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "smile 🙂? again ");
}

TEST(StopStringMatcher, WithDetokenizerAcrossTokenBoundaries) {
  // Every tokenization of the stop string is split over several tokens with this small
  // vocabulary; the stop is still found and nothing of it is emitted.
  const bpe_tokenizer& tok = fixture_tokenizer();
  const std::string text = "The answer is 42.\n\nUser: next question 🙂";
  const std::vector<int32_t> ids = tok.encode(text);
  incremental_detokenizer detok(tok);
  stop_string_matcher m({"\n\nUser:", "never"});
  std::string emitted;
  bool stopped = false;
  for (const int32_t id : ids) {
    const auto r = m.push(detok.push(id));
    emitted += r.text;
    if (r.stopped) {
      stopped = true;
      EXPECT_EQ(r.stop_index, 0u);
      break;
    }
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(emitted, "The answer is 42.");
}

TEST(StopStringMatcher, EveryDeltaSplitGivesTheSameResult) {
  const std::string text = "alpha beta ##END## gamma";
  for (size_t cut1 = 0; cut1 <= text.size(); ++cut1) {
    for (size_t cut2 = cut1; cut2 <= text.size(); cut2 += 3) {
      const auto r = run({"##END##"}, {text.substr(0, cut1), text.substr(cut1, cut2 - cut1), text.substr(cut2)});
      ASSERT_TRUE(r.stopped);
      ASSERT_EQ(r.text, "alpha beta ");
    }
  }
}

}  // namespace
}  // namespace hyserve::tokenizer::test
