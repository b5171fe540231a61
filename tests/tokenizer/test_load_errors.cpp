// Malformed or unsupported tokenizer.json: a format_error naming the file and the field.
#include <gtest/gtest.h>

#include <functional>

#include "hyserve/common/error.h"
#include "hyserve/tokenizer/bpe_tokenizer.h"
#include "tokenizer_test_support.h"

namespace hyserve::tokenizer::test {
namespace {

namespace json = boost::json;

struct error_case {
  const char* name;
  std::function<void(json::object&)> edit;  // applied to the fixture document
  std::vector<std::string> expected;        // substrings of the message
};

class LoadError : public ::testing::TestWithParam<error_case> {};

TEST_P(LoadError, NamesTheField) {
  const error_case& c = GetParam();
  json::object doc = fixture_json();
  c.edit(doc);
  try {
    bpe_tokenizer::from_json(json::serialize(doc), "bad.json");
    FAIL() << "loaded without error";
  } catch (const hyserve::format_error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("bad.json: ", 0), 0u) << msg;
    for (const auto& s : c.expected) EXPECT_NE(msg.find(s), std::string::npos) << "missing '" << s << "' in: " << msg;
  }
}

json::object& model(json::object& d) { return d["model"].as_object(); }
json::array& merges(json::object& d) { return model(d)["merges"].as_array(); }

const std::vector<error_case> kCases = {
    {"MissingModel", [](json::object& d) { d.erase("model"); }, {"model: missing required field"}},
    {"ModelNotObject", [](json::object& d) { d["model"] = json::array(); }, {"model: expected an object"}},
    {"UnknownModelType", [](json::object& d) { model(d)["type"] = "WordPiece"; }, {"model.type", "\"WordPiece\""}},
    {"MissingModelType", [](json::object& d) { model(d).erase("type"); model(d).erase("merges"); }, {"model.type"}},
    {"MissingVocab", [](json::object& d) { model(d).erase("vocab"); }, {"model.vocab: missing required field"}},
    {"VocabIdNotInteger", [](json::object& d) { model(d)["vocab"].as_object()["zz"] = "7"; },
     {"model.vocab[\"zz\"]", "expected an integer"}},
    {"VocabIdNegative", [](json::object& d) { model(d)["vocab"].as_object()["zz"] = -3; },
     {"model.vocab[\"zz\"]", "outside"}},
    {"MissingMerges", [](json::object& d) { model(d).erase("merges"); }, {"model.merges: missing required field"}},
    {"MergesNotArray", [](json::object& d) { model(d)["merges"] = "a b"; }, {"model.merges: expected an array"}},
    {"MergeUnknownLeftToken", [](json::object& d) { merges(d)[3] = json::array{"nope", "e"}; },
     {"model.merges[3]", "\"nope\" is not in model.vocab"}},
    {"MergeUnknownRightToken", [](json::object& d) { merges(d)[0] = "Ġ nope"; },
     {"model.merges[0]", "\"nope\" is not in model.vocab"}},
    {"MergedTokenNotInVocab", [](json::object& d) { merges(d)[5] = json::array{"q", "z"}; },
     {"model.merges[5]", "merged token \"qz\" is not in model.vocab"}},
    {"MergeNotStringOrPair", [](json::object& d) { merges(d)[2] = 17; }, {"model.merges[2]", "expected"}},
    {"MergeStringWithoutSpace", [](json::object& d) { merges(d)[1] = "ab"; }, {"model.merges[1]", "one space"}},
    {"MergeStringThreeParts", [](json::object& d) { merges(d)[1] = "a b c"; }, {"model.merges[1]", "one space"}},
    {"MergePairOfThree", [](json::object& d) { merges(d)[4] = json::array{"a", "b", "c"}; }, {"model.merges[4]"}},
    {"MergePairNotStrings", [](json::object& d) { merges(d)[4] = json::array{1, 2}; }, {"model.merges[4]"}},
    {"UnkTokenNotInVocab", [](json::object& d) { model(d)["unk_token"] = "<unk>"; },
     {"model.unk_token", "\"<unk>\" is not in model.vocab"}},
    {"ByteFallback", [](json::object& d) { model(d)["byte_fallback"] = true; }, {"model.byte_fallback"}},
    {"Dropout", [](json::object& d) { model(d)["dropout"] = 0.1; }, {"model.dropout"}},
    {"SubwordPrefix", [](json::object& d) { model(d)["continuing_subword_prefix"] = "##"; },
     {"model.continuing_subword_prefix"}},
    {"BadRegex",
     [](json::object& d) {
       d["pre_tokenizer"] = json::parse(
           R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(\\p{L}+"},
               "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "use_regex": false}]})");
     },
     {"pre_tokenizer.pretokenizers[0].pattern.Regex", "invalid regular expression"}},
    {"PatternWithBothForms",
     [](json::object& d) {
       d["pre_tokenizer"] = json::parse(
           R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "a", "String": "b"},
               "behavior": "Isolated"}, {"type": "ByteLevel"}]})");
     },
     {"pre_tokenizer.pretokenizers[0].pattern", "exactly one"}},
    {"UnknownSplitBehavior",
     [](json::object& d) {
       d["pre_tokenizer"] = json::parse(
           R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"String": " "},
               "behavior": "Sideways"}, {"type": "ByteLevel"}]})");
     },
     {"pre_tokenizer.pretokenizers[0].behavior", "\"Sideways\""}},
    {"UnsupportedPreTokenizer",
     [](json::object& d) { d["pre_tokenizer"] = json::parse(R"({"type": "Metaspace", "replacement": "_"})"); },
     {"pre_tokenizer.type", "\"Metaspace\""}},
    {"NoPreTokenizer", [](json::object& d) { d["pre_tokenizer"] = nullptr; }, {"pre_tokenizer:", "ByteLevel"}},
    {"ByteLevelNotLast",
     [](json::object& d) {
       d["pre_tokenizer"] = json::parse(
           R"({"type": "Sequence", "pretokenizers": [{"type": "ByteLevel"}, {"type": "Digits"}]})");
     },
     {"pre_tokenizer.pretokenizers[0]", "last"}},
    {"NfcNormalizer", [](json::object& d) { d["normalizer"] = json::parse(R"({"type": "NFC"})"); },
     {"normalizer.type", "NFC"}},
    {"NestedNfkc",
     [](json::object& d) {
       d["normalizer"] = json::parse(R"({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "x"},
                                         {"type": "NFKC"}]})");
     },
     {"normalizer.normalizers[1].type", "NFKC"}},
    {"UnknownNormalizer", [](json::object& d) { d["normalizer"] = json::parse(R"({"type": "Lowercase"})"); },
     {"normalizer.type", "\"Lowercase\""}},
    {"NoDecoder", [](json::object& d) { d["decoder"] = nullptr; }, {"decoder:", "ByteLevel"}},
    {"UnsupportedDecoder", [](json::object& d) { d["decoder"] = json::parse(R"({"type": "WordPiece"})"); },
     {"decoder.type", "\"WordPiece\""}},
    {"UnsupportedPostProcessor", [](json::object& d) { d["post_processor"] = json::parse(R"({"type": "Magic"})"); },
     {"post_processor.type", "\"Magic\""}},
    {"TemplateUnknownSpecial",
     [](json::object& d) {
       d["post_processor"] = json::parse(
           R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
               {"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {}})");
     },
     {"post_processor.special_tokens", "\"<s>\"", "post_processor.single[0]"}},
    {"TemplateIdOutOfVocab",
     [](json::object& d) {
       d["post_processor"] = json::parse(
           R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
               {"Sequence": {"id": "A", "type_id": 0}}],
               "special_tokens": {"<s>": {"id": "<s>", "ids": [9999], "tokens": ["<s>"]}}})");
     },
     {"post_processor", "9999"}},
    {"AddedTokenWithoutContent", [](json::object& d) { d["added_tokens"].as_array()[1].as_object().erase("content"); },
     {"added_tokens[1].content: missing required field"}},
    {"AddedTokenBadId", [](json::object& d) { d["added_tokens"].as_array()[2].as_object()["id"] = "two"; },
     {"added_tokens[2].id", "expected an integer"}},
    {"AddedTokenBadFlag", [](json::object& d) { d["added_tokens"].as_array()[0].as_object()["special"] = "yes"; },
     {"added_tokens[0].special", "expected a boolean"}},
};

INSTANTIATE_TEST_SUITE_P(Fixture, LoadError, ::testing::ValuesIn(kCases),
                         [](const auto& p) { return std::string(p.param.name); });

TEST(LoadError, NotJson) {
  try {
    bpe_tokenizer::from_json("{\"model\": ", "broken.json");
    FAIL();
  } catch (const hyserve::format_error& e) {
    EXPECT_NE(std::string(e.what()).find("broken.json: not valid JSON"), std::string::npos) << e.what();
  }
}

TEST(LoadError, TopLevelNotObject) {
  try {
    bpe_tokenizer::from_json("[1, 2]", "list.json");
    FAIL();
  } catch (const hyserve::format_error& e) {
    EXPECT_NE(std::string(e.what()).find("list.json: (top level): expected an object"), std::string::npos) << e.what();
  }
}

TEST(LoadError, MissingFile) {
  try {
    bpe_tokenizer::from_file("/nonexistent/tokenizer.json");
    FAIL();
  } catch (const hyserve::format_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizer.json: cannot read"), std::string::npos) << e.what();
  }
}

TEST(LoadError, GoodVariantsStillLoad) {
  // Absent optional sections and merges given as pairs are fine.
  json::object doc = fixture_json();
  doc.erase("normalizer");
  doc.erase("post_processor");
  doc.erase("added_tokens");
  model(doc).erase("ignore_merges");
  EXPECT_NO_THROW(load(doc));
}

}  // namespace
}  // namespace hyserve::tokenizer::test
