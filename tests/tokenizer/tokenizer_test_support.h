#pragma once
// Shared helpers of the tokenizer tests: the fixture tokenizer, its reference cases, and
// tokenizer.json variants built by editing the fixture document.
#include <boost/json.hpp>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fixture.h"
#include "hyserve/tokenizer/bpe_tokenizer.h"

namespace hyserve::tokenizer::test {

inline std::string fixture_path(const std::string& file) {
  return hyserve::test::fixture_dir("tokenizer-bpe512") + "/" + file;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The fixture tokenizer, loaded once per test binary.
inline const bpe_tokenizer& fixture_tokenizer() {
  static const bpe_tokenizer tok = bpe_tokenizer::from_file(fixture_path("tokenizer.json"));
  return tok;
}

inline boost::json::object fixture_json() { return boost::json::parse(read_file(fixture_path("tokenizer.json"))).as_object(); }

inline bpe_tokenizer load(const boost::json::object& doc) {
  return bpe_tokenizer::from_json(boost::json::serialize(doc), "test.json");
}

struct reference_case {
  std::string text;
  std::vector<int32_t> ids;
  std::string decoded;
};

inline std::vector<reference_case> reference_cases() {
  const boost::json::value v = boost::json::parse(read_file(fixture_path("reference.json")));
  std::vector<reference_case> out;
  for (const auto& c : v.at("cases").as_array()) {
    reference_case r;
    r.text = c.at("text").as_string();
    r.ids = boost::json::value_to<std::vector<int32_t>>(c.at("ids"));
    r.decoded = c.at("decoded").as_string();
    out.push_back(std::move(r));
  }
  return out;
}

// The byte-level character of a byte (GPT-2 table), for building vocabularies in tests.
inline std::string byte_char(unsigned char b) {
  const auto printable = [](int c) { return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE; };
  unsigned cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int k = 0; k < b; ++k)
      if (!printable(k)) ++cp;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(char(cp));
  } else {
    s.push_back(char(0xC0 | (cp >> 6)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  }
  return s;
}

inline std::string byte_chars(std::string_view bytes) {
  std::string s;
  for (const char c : bytes) s += byte_char(static_cast<unsigned char>(c));
  return s;
}

// A small byte-level BPE document: all 256 byte tokens (ids 0..255) and the given merges (in
// byte-level form, "a b"), each merged token getting the next id. Components default to a
// plain ByteLevel setup; tests replace them.
inline boost::json::object small_bpe(const std::vector<std::pair<std::string, std::string>>& merges) {
  boost::json::object vocab;
  for (int b = 0; b < 256; ++b) vocab[byte_char(static_cast<unsigned char>(b))] = b;
  boost::json::array merge_list;
  int next = 256;
  for (const auto& [l, r] : merges) {
    merge_list.push_back(boost::json::string(l + " " + r));
    if (!vocab.contains(l + r)) vocab[l + r] = next++;
  }
  boost::json::object model{{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}};
  boost::json::object doc;
  doc["version"] = "1.0";
  doc["added_tokens"] = boost::json::array();
  doc["normalizer"] = nullptr;
  doc["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  doc["post_processor"] = nullptr;
  doc["decoder"] = {{"type", "ByteLevel"}};
  doc["model"] = model;
  return doc;
}

}  // namespace hyserve::tokenizer::test
