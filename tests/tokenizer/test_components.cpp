// Components beyond the fixture: Split behaviours, Llama-3 / Qwen style pre-tokenizers,
// Digits, add_prefix_space, added-token options, post-processor templates, normalizers, and
// the BPE merge loop against a naive reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <map>
#include <random>
#include <thread>

#include "hyserve/tokenizer/bpe_tokenizer.h"
#include "tokenizer_test_support.h"

namespace hyserve::tokenizer::test {
namespace {

namespace json = boost::json;
using words = std::vector<std::string>;

json::object byte_level(bool add_prefix_space, bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

json::object split(std::string_view kind, std::string_view pattern, std::string_view behavior, bool invert = false) {
  return {{"type", "Split"}, {"pattern", {{kind, pattern}}}, {"behavior", behavior}, {"invert", invert}};
}

// The fixture with `pre` as its pre-tokenizer.
bpe_tokenizer with_pre_tokenizer(const json::value& pre) {
  json::object doc = fixture_json();
  doc["pre_tokenizer"] = pre;
  return load(doc);
}

json::object sequence(std::initializer_list<json::value> steps) {
  json::array list;
  for (const json::value& s : steps) list.push_back(s);
  return {{"type", "Sequence"}, {"pretokenizers", list}};
}

// ---- Split behaviours (the examples of the `tokenizers` documentation) -------------------

struct behavior_case {
  const char* behavior;
  bool invert;
  words expected;
};

class SplitBehavior : public ::testing::TestWithParam<behavior_case> {};

TEST_P(SplitBehavior, TheFinalCountdown) {
  const behavior_case& c = GetParam();
  for (const char* kind : {"String", "Regex"}) {
    const bpe_tokenizer tok =
        with_pre_tokenizer(sequence({split(kind, "-", c.behavior, c.invert), byte_level(false, false)}));
    EXPECT_EQ(tok.pre_tokenize("the-final--countdown"), c.expected) << kind;
    std::string joined;
    for (const auto& w : c.expected) joined += w;
    EXPECT_EQ(tok.decode(tok.encode("the-final--countdown")), joined);  // Removed drops text
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixture, SplitBehavior,
    ::testing::Values(behavior_case{"Removed", false, {"the", "final", "countdown"}},
                      behavior_case{"Isolated", false, {"the", "-", "final", "-", "-", "countdown"}},
                      behavior_case{"MergedWithPrevious", false, {"the-", "final-", "-", "countdown"}},
                      behavior_case{"MergedWithNext", false, {"the", "-final", "-", "-countdown"}},
                      behavior_case{"Contiguous", false, {"the", "-", "final", "--", "countdown"}},
                      behavior_case{"Removed", true, {"-", "-", "-"}},
                      behavior_case{"Isolated", true, {"the", "-", "final", "-", "-", "countdown"}},
                      behavior_case{"MergedWithPrevious", true, {"the", "-final", "-", "-countdown"}},
                      behavior_case{"MergedWithNext", true, {"the-", "final-", "-", "countdown"}}),
    [](const auto& p) { return std::string(p.param.behavior) + (p.param.invert ? "_inverted" : ""); });

TEST(SplitBehavior, MatchesAtBothEnds) {
  const bpe_tokenizer tok = with_pre_tokenizer(sequence({split("String", "-", "MergedWithNext"), byte_level(false, false)}));
  EXPECT_EQ(tok.pre_tokenize("-a-"), (words{"-a", "-"}));
  const bpe_tokenizer prev =
      with_pre_tokenizer(sequence({split("String", "-", "MergedWithPrevious"), byte_level(false, false)}));
  EXPECT_EQ(prev.pre_tokenize("-a-"), (words{"-", "a-"}));
  const bpe_tokenizer cont = with_pre_tokenizer(sequence({split("String", "-", "Contiguous"), byte_level(false, false)}));
  EXPECT_EQ(cont.pre_tokenize("--a--"), (words{"--", "a", "--"}));
}

// ---- real-world pre-tokenizers ----------------------------------------------------------

constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

TEST(PreTokenizer, Llama3Split) {
  const bpe_tokenizer tok =
      with_pre_tokenizer(sequence({split("Regex", kLlama3Pattern, "Isolated"), byte_level(false, false)}));
  EXPECT_EQ(tok.pre_tokenize("I'M 12345 done!\n\n  x"),
            (words{"I", "'M", " ", "123", "45", " done", "!\n\n", " ", " x"}));
  EXPECT_EQ(tok.pre_tokenize("héllo,wörld"), (words{"héllo", ",wörld"}));
  const std::string text = "Ünïcödé 中文 12345678 don't\t\ttabs\r\n";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
}

TEST(PreTokenizer, QwenDigitsOneByOne) {
  const std::string pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const bpe_tokenizer tok = with_pre_tokenizer(sequence({split("Regex", pattern, "Isolated"), byte_level(false, false)}));
  EXPECT_EQ(tok.pre_tokenize("x 2024"), (words{"x", " ", "2", "0", "2", "4"}));
}

TEST(PreTokenizer, Digits) {
  const bpe_tokenizer single = with_pre_tokenizer(
      sequence({{{"type", "Digits"}, {"individual_digits", true}}, byte_level(false, true)}));
  EXPECT_EQ(single.pre_tokenize("ab 123"), (words{"ab", " ", "1", "2", "3"}));
  const bpe_tokenizer runs = with_pre_tokenizer(
      sequence({{{"type", "Digits"}, {"individual_digits", false}}, byte_level(false, false)}));
  EXPECT_EQ(runs.pre_tokenize("ab 123c"), (words{"ab ", "123", "c"}));
}

TEST(PreTokenizer, ByteLevelPrefixSpace) {
  const bpe_tokenizer tok = with_pre_tokenizer(byte_level(true, true));
  EXPECT_EQ(tok.pre_tokenize("Hello world"), (words{" Hello", " world"}));
  EXPECT_EQ(tok.pre_tokenize(" Hello"), (words{" Hello"}));
  // Every segment between added tokens gets its own prefix space, as in `tokenizers`.
  EXPECT_EQ(tok.pre_tokenize("a<|im_end|>b"), (words{" a", " b"}));
  // The prefix space is part of the ids, so decoding shows it.
  EXPECT_EQ(tok.decode(tok.encode("Hello")), " Hello");
}

TEST(PreTokenizer, RegexWithoutJitStackTroubleOnHugeRuns) {
  const bpe_tokenizer tok =
      with_pre_tokenizer(sequence({split("Regex", kLlama3Pattern, "Isolated"), byte_level(false, false)}));
  const std::string spaces(300000, ' ');
  const std::string text = spaces + "x" + spaces;
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
}

// ---- added tokens -----------------------------------------------------------------------

json::object added(int id, std::string_view content, bool special, bool lstrip = false, bool rstrip = false,
                   bool single_word = false) {
  return {{"id", id},         {"content", content},         {"single_word", single_word}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", false},         {"special", special}};
}

TEST(AddedTokens, LongestMatchAtEachPosition) {
  json::object doc = fixture_json();
  json::array& list = doc["added_tokens"].as_array();
  list.push_back(added(600, "<|im", false));
  list.push_back(added(601, "<|im_start|>x", false));
  const bpe_tokenizer tok = load(doc);
  EXPECT_EQ(tok.vocab_size(), 602);
  EXPECT_EQ(tok.encode("<|im_start|>x"), (std::vector<int32_t>{601}));
  EXPECT_EQ(tok.encode("<|im_start|>"), (std::vector<int32_t>{1}));
  std::vector<int32_t> ids = tok.encode("<|im_");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 600);
  // Non-special added tokens survive skip_special_tokens.
  EXPECT_EQ(tok.decode(tok.encode("a<|im_start|>xb<|im_end|>")), "a<|im_start|>xb");
}

TEST(AddedTokens, LstripRstrip) {
  json::object doc = fixture_json();
  doc["added_tokens"].as_array().push_back(added(600, "<mask>", true, true, true));
  const bpe_tokenizer tok = load(doc);
  EXPECT_EQ(tok.pre_tokenize("a  <mask>\t b"), (words{"a", "b"}));
  const std::vector<int32_t> ids = tok.encode("a  <mask>\t b");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 600), 1);
  EXPECT_EQ(ids.size(), 3u);
}

TEST(AddedTokens, SingleWord) {
  json::object doc = fixture_json();
  doc["added_tokens"].as_array().push_back(added(600, "cat", false, false, false, true));
  const bpe_tokenizer tok = load(doc);
  const auto count = [&](const std::string& s) {
    const auto ids = tok.encode(s);
    return std::count(ids.begin(), ids.end(), 600);
  };
  EXPECT_EQ(count("cat"), 1);
  EXPECT_EQ(count("a cat!"), 1);
  EXPECT_EQ(count("concat"), 0);
  EXPECT_EQ(count("cats"), 0);
  EXPECT_EQ(count("écat"), 0);
  EXPECT_EQ(tok.decode(tok.encode("concat cat")), "concat cat");
}

// ---- post-processors --------------------------------------------------------------------

TEST(PostProcessor, TemplateAddsBosAndEos) {
  json::object doc = fixture_json();
  doc["post_processor"] = json::parse(R"({
    "type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}],
       "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
       "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]},
                          "<|im_end|>": {"id": "<|im_end|>", "ids": [2], "tokens": ["<|im_end|>"]}}}]})");
  const bpe_tokenizer tok = load(doc);
  const std::vector<int32_t> plain = fixture_tokenizer().encode("Hello");
  std::vector<int32_t> expected = {1};
  expected.insert(expected.end(), plain.begin(), plain.end());
  expected.push_back(2);
  EXPECT_EQ(tok.encode("Hello"), expected);
  EXPECT_EQ(tok.encode("Hello", {.add_special_tokens = false}), plain);
  EXPECT_EQ(tok.encode(""), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(tok.decode(tok.encode("Hello")), "Hello");
  EXPECT_EQ(std::vector<int32_t>(tok.template_prefix().begin(), tok.template_prefix().end()), std::vector<int32_t>{1});
}

TEST(PostProcessor, Roberta) {
  json::object doc = fixture_json();
  doc["post_processor"] = json::parse(
      R"({"type": "RobertaProcessing", "sep": ["<|im_end|>", 2], "cls": ["<|im_start|>", 1],
          "trim_offsets": true, "add_prefix_space": false})");
  const bpe_tokenizer tok = load(doc);
  const std::vector<int32_t> ids = tok.encode("x");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
}

// ---- normalizers ------------------------------------------------------------------------

TEST(Normalizer, PrependAndReplace) {
  json::object doc = fixture_json();
  doc["normalizer"] = json::parse(
      R"({"type": "Sequence", "normalizers": [
            {"type": "Replace", "pattern": {"String": "\t"}, "content": "    "},
            {"type": "Replace", "pattern": {"Regex": "\\d+"}, "content": "#"},
            {"type": "Prepend", "prepend": ">"}]})");
  const bpe_tokenizer tok = load(doc);
  EXPECT_EQ(tok.decode(tok.encode("a\tb 123 c")), ">a    b # c");
  EXPECT_EQ(tok.encode(""), std::vector<int32_t>{});  // Prepend leaves empty text empty
}

// ---- the BPE model ----------------------------------------------------------------------

TEST(BpeModel, MergesByRankLeftmostFirst) {
  const bpe_tokenizer tok = load(small_bpe({{"a", "a"}, {"b", "c"}, {"a", "b"}, {"ab", "c"}, {"a", "bc"}}));
  const int32_t aa = *tok.token_to_id("aa"), bc = *tok.token_to_id("bc"), abc = *tok.token_to_id("abc");
  EXPECT_EQ(tok.encode("aaa"), (std::vector<int32_t>{aa, 'a'}));
  EXPECT_EQ(tok.encode("aaaa"), (std::vector<int32_t>{aa, aa}));
  // b c (rank 1) beats a b (rank 2); then a + bc merges (rank 4), not ab + c.
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{*tok.token_to_id("abc")}));
  EXPECT_EQ(tok.encode("abcbc"), (std::vector<int32_t>{abc, bc}));
}

TEST(BpeModel, MergePairFormsAreEquivalent) {
  json::object doc = small_bpe({{"a", "b"}, {"ab", "c"}});
  const bpe_tokenizer strings = load(doc);
  json::array pairs;
  pairs.push_back(json::array{"a", "b"});
  pairs.push_back(json::array{"ab", "c"});
  doc["model"].as_object()["merges"] = pairs;
  const bpe_tokenizer arrays = load(doc);
  EXPECT_EQ(strings.encode("abcab"), arrays.encode("abcab"));
  EXPECT_EQ(strings.encode("abcab").size(), 2u);
}

// Quadratic textbook BPE: merge the lowest-ranked adjacent pair (leftmost on ties) until
// none is left.
std::vector<int32_t> naive_bpe(const std::string& word, const std::map<std::pair<int32_t, int32_t>, std::pair<int, int32_t>>& merges) {
  std::vector<int32_t> syms;
  for (const char c : word) syms.push_back(static_cast<unsigned char>(c));
  for (;;) {
    int best_rank = INT_MAX;
    size_t best_pos = 0;
    int32_t best_id = -1;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      const auto it = merges.find({syms[i], syms[i + 1]});
      if (it != merges.end() && it->second.first < best_rank) best_rank = it->second.first, best_pos = i, best_id = it->second.second;
    }
    if (best_id < 0) return syms;
    syms[best_pos] = best_id;
    syms.erase(syms.begin() + long(best_pos) + 1);
  }
}

TEST(BpeModel, HeapMergeMatchesNaiveReferenceOnRandomMerges) {
  std::mt19937_64 rng(2024);
  for (int trial = 0; trial < 20; ++trial) {
    // Random merge list over "abcd": each new token formed once (as trained merges are).
    std::vector<std::string> tokens = {"a", "b", "c", "d"};
    std::vector<std::pair<std::string, std::string>> merges;
    for (int k = 0; k < 60; ++k) {
      const std::string& l = tokens[rng() % tokens.size()];
      const std::string& r = tokens[rng() % tokens.size()];
      const std::string m = l + r;
      if (m.size() > 12 || std::find(tokens.begin(), tokens.end(), m) != tokens.end()) continue;
      merges.emplace_back(l, r);
      tokens.push_back(m);
    }
    const bpe_tokenizer tok = load(small_bpe(merges));
    std::map<std::pair<int32_t, int32_t>, std::pair<int, int32_t>> table;
    for (size_t i = 0; i < merges.size(); ++i) {
      const auto& [l, r] = merges[i];
      table[{*tok.token_to_id(l), *tok.token_to_id(r)}] = {int(i), *tok.token_to_id(l + r)};
    }
    for (int w = 0; w < 200; ++w) {
      std::string word(1 + rng() % 40, 'a');
      for (auto& c : word) c = char('a' + rng() % 4);
      ASSERT_EQ(tok.encode(word), naive_bpe(word, table)) << "trial " << trial << " word " << word;
    }
  }
}

TEST(BpeModel, IgnoreMergesTakesWholeWordTokens) {
  // "abc" is in the vocabulary but no merge chain reaches it.
  json::object doc = small_bpe({{"a", "b"}});
  doc["model"].as_object()["vocab"].as_object()["abc"] = 400;
  const bpe_tokenizer plain = load(doc);
  EXPECT_EQ(plain.encode("abc"), (std::vector<int32_t>{*plain.token_to_id("ab"), 'c'}));
  doc["model"].as_object()["ignore_merges"] = true;
  const bpe_tokenizer ignoring = load(doc);
  EXPECT_EQ(ignoring.encode("abc"), (std::vector<int32_t>{400}));
}

TEST(BpeModel, UnknownBytesUseUnkToken) {
  json::object doc = small_bpe({});
  json::object& vocab = doc["model"].as_object()["vocab"].as_object();
  vocab.erase(byte_char(0xC3));
  vocab.erase(byte_char(0xA9));
  vocab["<unk>"] = 300;
  const bpe_tokenizer dropping = load(doc);
  EXPECT_EQ(dropping.encode("xéy"), (std::vector<int32_t>{'x', 'y'}));
  doc["model"].as_object()["unk_token"] = "<unk>";
  const bpe_tokenizer unk = load(doc);
  EXPECT_EQ(unk.encode("xéy"), (std::vector<int32_t>{'x', 300, 300, 'y'}));
  doc["model"].as_object()["fuse_unk"] = true;
  const bpe_tokenizer fused = load(doc);
  EXPECT_EQ(fused.encode("xéy"), (std::vector<int32_t>{'x', 300, 'y'}));
  EXPECT_EQ(fused.encode("é"), (std::vector<int32_t>{300}));
}

TEST(BpeModel, ConcurrentEncodesAgree) {
  const bpe_tokenizer& tok = fixture_tokenizer();
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "word" + std::to_string(i % 97) + " 中文 ";
  const std::vector<int32_t> expected = tok.encode(text);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (auto& g : got) threads.emplace_back([&] { g = tok.encode(text); });
  for (auto& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(g, expected);
}

}  // namespace
}  // namespace hyserve::tokenizer::test
