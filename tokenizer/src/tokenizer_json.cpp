// Loading tokenizer.json into bpe_tokenizer::impl. Every error is a format_error that names
// the file and the field path ("model.merges[12]", "pre_tokenizer.pretokenizers[0].pattern").
#include <boost/json.hpp>

#include "byte_level.h"
#include "hyserve/common/error.h"
#include "hyserve/common/json.h"
#include "hyserve/tokenizer/bpe_tokenizer.h"
#include "tokenizer_impl.h"

namespace hyserve::tokenizer {

namespace {

namespace json = boost::json;

// Ids at or above this are refused: per-id tables are sized by the largest id.
constexpr int64_t kMaxTokenId = int64_t{1} << 24;

std::string quoted(std::string_view s) { return json::serialize(json::value(json::string(s))); }

std::string member(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

std::string element(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

// Typed access to tokenizer.json values; failures name the source and the field path.
class reader {
 public:
  explicit reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw format_error(source_ + ": " + field + ": " + what);
  }

  // Absent and null both count as "not given" (tokenizers writes null for unset options).
  static const json::value* find(const json::object& o, std::string_view key) {
    const json::value* v = o.if_contains(key);
    return (v && !v->is_null()) ? v : nullptr;
  }

  const json::value& require(const json::object& o, const std::string& path, std::string_view key) const {
    const json::value* v = find(o, key);
    if (!v) fail(member(path, key), "missing required field");
    return *v;
  }

  const json::object& object(const json::value& v, const std::string& path) const {
    if (!v.is_object()) fail(path, "expected an object, got " + std::string(json_kind_name(v)));
    return v.get_object();
  }

  const json::array& array(const json::value& v, const std::string& path) const {
    if (!v.is_array()) fail(path, "expected an array, got " + std::string(json_kind_name(v)));
    return v.get_array();
  }

  std::string_view string(const json::value& v, const std::string& path) const {
    if (!v.is_string()) fail(path, "expected a string, got " + json_excerpt(v));
    return v.get_string();
  }

  int64_t integer(const json::value& v, const std::string& path) const {
    if (v.is_int64()) return v.get_int64();
    if (v.is_uint64() && v.get_uint64() <= static_cast<uint64_t>(INT64_MAX)) return int64_t(v.get_uint64());
    fail(path, "expected an integer, got " + json_excerpt(v));
  }

  int32_t token_id(const json::value& v, const std::string& path) const {
    const int64_t id = integer(v, path);
    if (id < 0 || id >= kMaxTokenId)
      fail(path, "token id " + std::to_string(id) + " is outside [0, " + std::to_string(kMaxTokenId) + ")");
    return int32_t(id);
  }

  bool boolean(const json::object& o, const std::string& path, std::string_view key, bool fallback) const {
    const json::value* v = find(o, key);
    if (!v) return fallback;
    if (!v->is_bool()) fail(member(path, key), "expected a boolean, got " + json_excerpt(*v));
    return v->get_bool();
  }

  std::string_view type(const json::object& o, const std::string& path) const {
    return string(require(o, path, "type"), member(path, "type"));
  }

 private:
  std::string source_;
};

// {"Regex": "..."} or {"String": "..."}.
std::shared_ptr<const split_pattern> load_pattern(const reader& r, const json::value& v, const std::string& path) {
  const json::object& o = r.object(v, path);
  const json::value* re = reader::find(o, "Regex");
  const json::value* lit = reader::find(o, "String");
  if ((re != nullptr) == (lit != nullptr)) r.fail(path, "expected exactly one of \"Regex\" and \"String\"");
  if (lit) return split_pattern::literal(r.string(*lit, member(path, "String")));
  std::string error;
  std::unique_ptr<split_pattern> p = split_pattern::regex(r.string(*re, member(path, "Regex")), error);
  if (!p) r.fail(member(path, "Regex"), (HYSERVE_TOKENIZER_HAS_REGEX ? "invalid regular expression: " : "") + error);
  return p;
}

// ---- model ----------------------------------------------------------------------------

struct loaded_model {
  bpe_model_spec spec;
  token_id_map by_string;  // model.vocab
  int32_t max_id = -1;
};

loaded_model load_model(const reader& r, const json::value& v) {
  const std::string path = "model";
  const json::object& m = r.object(v, path);
  if (const json::value* t = reader::find(m, "type")) {
    const std::string_view type = r.string(*t, "model.type");
    if (type != "BPE") r.fail("model.type", "unsupported model type " + quoted(type) + " (only BPE)");
  } else if (!reader::find(m, "merges")) {
    r.fail("model.type", "missing required field");
  }
  if (r.boolean(m, path, "byte_fallback", false))
    r.fail("model.byte_fallback", "byte fallback is not supported (byte-level BPE only)");
  if (const json::value* d = reader::find(m, "dropout")) {
    if (!d->is_number()) r.fail("model.dropout", "expected a number, got " + json_excerpt(*d));
    if (d->to_number<double>() != 0.0) r.fail("model.dropout", "BPE dropout is not supported");
  }
  for (const std::string_view key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const json::value* s = reader::find(m, key)) {
      if (!r.string(*s, member(path, key)).empty()) r.fail(member(path, key), "not supported for byte-level BPE");
    }
  }

  loaded_model out;
  const json::object& vocab = r.object(r.require(m, path, "vocab"), "model.vocab");
  token_id_map& by_string = out.by_string;
  by_string.reserve(vocab.size());
  for (const auto& kv : vocab) {
    const json::value& val = kv.value();
    // Field paths are built only for the error message (vocabularies have 10^5 entries).
    const bool plain = val.is_int64() && val.get_int64() >= 0 && val.get_int64() < kMaxTokenId;
    const int32_t id =
        plain ? int32_t(val.get_int64()) : r.token_id(val, "model.vocab[" + quoted(kv.key()) + "]");
    by_string.emplace(kv.key(), id);
    out.max_id = std::max(out.max_id, id);
  }

  bpe_model_spec& spec = out.spec;
  spec.fuse_unk = r.boolean(m, path, "fuse_unk", false);
  spec.ignore_merges = r.boolean(m, path, "ignore_merges", false);
  if (const json::value* u = reader::find(m, "unk_token")) {
    const std::string_view unk = r.string(*u, "model.unk_token");
    const auto it = by_string.find(unk);
    if (it == by_string.end()) r.fail("model.unk_token", quoted(unk) + " is not in model.vocab");
    spec.unk_id = it->second;
  }

  const byte_level_table& bl = byte_level_table::get();
  for (int b = 0; b < 256; ++b) {
    const auto it = by_string.find(bl.to_chars(std::string(1, char(b))));
    spec.byte_ids[b] = it == by_string.end() ? -1 : it->second;
  }
  if (spec.ignore_merges) {
    spec.bytes_to_id.reserve(by_string.size());
    for (const auto& [token, id] : by_string) {
      if (std::optional<std::string> bytes = bl.to_bytes(token)) spec.bytes_to_id.emplace(std::move(*bytes), id);
    }
  }

  const json::array& merges = r.array(r.require(m, path, "merges"), "model.merges");
  spec.merges.reserve(merges.size());
  const auto lookup = [&](size_t i, std::string_view token, const char* what) {
    const auto it = by_string.find(token);
    if (it == by_string.end()) r.fail(element("model.merges", i), std::string(what) + quoted(token) + " is not in model.vocab");
    return it->second;
  };
  std::string joined;
  for (size_t i = 0; i < merges.size(); ++i) {
    const json::value& e = merges[i];
    std::string_view left, right;
    if (e.is_string()) {
      const std::string_view s = e.get_string();
      const size_t sp = s.find(' ');
      if (sp == std::string_view::npos || sp == 0 || sp + 1 == s.size() || s.find(' ', sp + 1) != std::string_view::npos)
        r.fail(element("model.merges", i), "expected \"left right\" (two tokens, one space), got " + json_excerpt(e));
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (e.is_array() && e.get_array().size() == 2 && e.get_array()[0].is_string() &&
               e.get_array()[1].is_string()) {
      left = e.get_array()[0].get_string();
      right = e.get_array()[1].get_string();
    } else {
      r.fail(element("model.merges", i), "expected \"left right\" or [\"left\", \"right\"], got " + json_excerpt(e));
    }
    const int32_t l = lookup(i, left, "token ");
    const int32_t rt = lookup(i, right, "token ");
    joined.assign(left);
    joined.append(right);
    const int32_t merged = lookup(i, joined, "merged token ");
    spec.merges.push_back({l, rt, merged});
  }
  return out;
}

// ---- added tokens ---------------------------------------------------------------------

std::vector<added_token> load_added_tokens(const reader& r, const json::object& root) {
  std::vector<added_token> out;
  const json::value* v = reader::find(root, "added_tokens");
  if (!v) return out;
  const json::array& a = r.array(*v, "added_tokens");
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string path = element("added_tokens", i);
    const json::object& o = r.object(a[i], path);
    added_token t;
    t.id = r.token_id(r.require(o, path, "id"), member(path, "id"));
    t.content = r.string(r.require(o, path, "content"), member(path, "content"));
    if (t.content.empty()) r.fail(member(path, "content"), "empty token");
    t.special = r.boolean(o, path, "special", false);
    t.lstrip = r.boolean(o, path, "lstrip", false);
    t.rstrip = r.boolean(o, path, "rstrip", false);
    t.single_word = r.boolean(o, path, "single_word", false);
    r.boolean(o, path, "normalized", false);  // type-checked only; see bpe_tokenizer.h
    out.push_back(std::move(t));
  }
  return out;
}

// ---- normalizer -----------------------------------------------------------------------

void load_normalizer(const reader& r, const json::value& v, const std::string& path, std::vector<normalize_step>& out) {
  if (v.is_null()) return;
  const json::object& o = r.object(v, path);
  const std::string_view type = r.type(o, path);
  if (type == "Sequence") {
    const std::string list = member(path, "normalizers");
    const json::array& a = r.array(r.require(o, path, "normalizers"), list);
    for (size_t i = 0; i < a.size(); ++i) load_normalizer(r, a[i], element(list, i), out);
  } else if (type == "Prepend") {
    normalize_step s;
    s.kind = normalize_step::kind_t::kPrepend;
    s.text = r.string(r.require(o, path, "prepend"), member(path, "prepend"));
    out.push_back(std::move(s));
  } else if (type == "Replace") {
    normalize_step s;
    s.kind = normalize_step::kind_t::kReplace;
    s.pattern = load_pattern(r, r.require(o, path, "pattern"), member(path, "pattern"));
    s.text = r.string(r.require(o, path, "content"), member(path, "content"));
    out.push_back(std::move(s));
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    r.fail(member(path, "type"), "Unicode normalization " + std::string(type) + " is not supported");
  } else {
    r.fail(member(path, "type"), "unsupported normalizer " + quoted(type) + " (supported: Sequence, Prepend, Replace)");
  }
}

// ---- pre-tokenizer --------------------------------------------------------------------

struct pre_tokenizer_state {
  std::shared_ptr<const split_pattern> gpt2;  // compiled on first use
  std::string byte_level_path;                // path of the ByteLevel step, empty if none
  size_t byte_level_index = 0;
};

split_behavior parse_behavior(const reader& r, const json::value& v, const std::string& path) {
  const std::string_view s = r.string(v, path);
  if (s == "Removed") return split_behavior::kRemoved;
  if (s == "Isolated") return split_behavior::kIsolated;
  if (s == "MergedWithPrevious") return split_behavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return split_behavior::kMergedWithNext;
  if (s == "Contiguous") return split_behavior::kContiguous;
  r.fail(path, "unknown behavior " + quoted(s) +
                   " (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)");
}

std::shared_ptr<const split_pattern> compile_builtin(const reader& r, std::string_view pattern, const std::string& path) {
  std::string error;
  std::unique_ptr<split_pattern> p = split_pattern::regex(pattern, error);
  if (!p) r.fail(path, (HYSERVE_TOKENIZER_HAS_REGEX ? "built-in pattern failed to compile: " : "") + error);
  return p;
}

void load_pre_tokenizer(const reader& r, const json::value& v, const std::string& path, std::vector<pre_split_step>& out,
                        pre_tokenizer_state& st) {
  if (v.is_null()) return;
  const json::object& o = r.object(v, path);
  const std::string_view type = r.type(o, path);
  if (type == "Sequence") {
    const std::string list = member(path, "pretokenizers");
    const json::array& a = r.array(r.require(o, path, "pretokenizers"), list);
    for (size_t i = 0; i < a.size(); ++i) load_pre_tokenizer(r, a[i], element(list, i), out, st);
    return;
  }
  pre_split_step s;
  if (type == "ByteLevel") {
    if (!st.byte_level_path.empty()) r.fail(path, "a second ByteLevel step (the first is " + st.byte_level_path + ")");
    // Defaults of the `tokenizers` ByteLevel pre-tokenizer.
    s.prefix_space = r.boolean(o, path, "add_prefix_space", true);
    if (r.boolean(o, path, "use_regex", true)) {
      if (!st.gpt2) st.gpt2 = compile_builtin(r, kGpt2Pattern, path);
      s.pattern = st.gpt2;
    }
    st.byte_level_path = path;
    st.byte_level_index = out.size();
  } else if (type == "Split") {
    s.pattern = load_pattern(r, r.require(o, path, "pattern"), member(path, "pattern"));
    s.behavior = parse_behavior(r, r.require(o, path, "behavior"), member(path, "behavior"));
    s.invert = r.boolean(o, path, "invert", false);
  } else if (type == "Digits") {
    const bool individual = r.boolean(o, path, "individual_digits", false);
    s.pattern = compile_builtin(r, individual ? R"(\p{N})" : R"(\p{N}+)", path);
  } else {
    r.fail(member(path, "type"),
           "unsupported pre-tokenizer " + quoted(type) + " (supported: ByteLevel, Split, Digits, Sequence)");
  }
  out.push_back(std::move(s));
}

// ---- post-processor -------------------------------------------------------------------

struct special_affixes {
  std::vector<int32_t> prefix, suffix;
};

special_affixes load_template(const reader& r, const json::object& o, const std::string& path) {
  special_affixes out;
  const std::string single_path = member(path, "single");
  const json::array& single = r.array(r.require(o, path, "single"), single_path);
  const json::object* specials = nullptr;
  if (const json::value* s = reader::find(o, "special_tokens")) specials = &r.object(*s, member(path, "special_tokens"));
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string item_path = element(single_path, i);
    const json::value& item = single[i];
    std::string sequence_id, special_name;
    if (item.is_string()) {
      // Shorthand form: "$A" / "$0" for the sequence, anything else names a special token.
      const std::string_view s = item.get_string();
      if (!s.empty() && s.front() == '$') {
        sequence_id = s.substr(1);
      } else {
        special_name = s;
      }
    } else {
      const json::object& io = r.object(item, item_path);
      if (const json::value* seq = reader::find(io, "Sequence")) {
        const std::string p = member(item_path, "Sequence");
        sequence_id = r.string(r.require(r.object(*seq, p), p, "id"), member(p, "id"));
      } else if (const json::value* sp = reader::find(io, "SpecialToken")) {
        const std::string p = member(item_path, "SpecialToken");
        special_name = r.string(r.require(r.object(*sp, p), p, "id"), member(p, "id"));
      } else {
        r.fail(item_path, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
    }
    if (special_name.empty()) {
      if (sequence_id != "A" && sequence_id != "0" && !sequence_id.empty())
        r.fail(item_path, "the single-sequence template refers to sequence " + quoted(sequence_id));
      if (seen_sequence) r.fail(item_path, "sequence A appears twice");
      seen_sequence = true;
      continue;
    }
    const std::string sp_path = member(path, "special_tokens");
    const json::value* entry = specials ? reader::find(*specials, special_name) : nullptr;
    if (!entry) r.fail(sp_path, "no entry for " + quoted(special_name) + " used in " + item_path);
    const std::string entry_path = sp_path + "[" + quoted(special_name) + "]";
    const std::string ids_path = member(entry_path, "ids");
    const json::array& ids = r.array(r.require(r.object(*entry, entry_path), entry_path, "ids"), ids_path);
    std::vector<int32_t>& dst = seen_sequence ? out.suffix : out.prefix;
    for (size_t k = 0; k < ids.size(); ++k) dst.push_back(r.token_id(ids[k], element(ids_path, k)));
  }
  if (!seen_sequence) r.fail(single_path, "the template has no {\"Sequence\": {\"id\": \"A\"}} item");
  return out;
}

int32_t load_pair_id(const reader& r, const json::object& o, const std::string& path, std::string_view key) {
  const std::string p = member(path, key);
  const json::array& a = r.array(r.require(o, path, key), p);
  if (a.size() != 2 || !a[0].is_string()) r.fail(p, "expected [\"token\", id]");
  return r.token_id(a[1], element(p, 1));
}

void load_post_processor(const reader& r, const json::value& v, const std::string& path, special_affixes& out) {
  if (v.is_null()) return;
  const json::object& o = r.object(v, path);
  const std::string_view type = r.type(o, path);
  special_affixes step;
  if (type == "ByteLevel") {
    return;  // adjusts offsets only
  } else if (type == "Sequence") {
    const std::string list = member(path, "processors");
    const json::array& a = r.array(r.require(o, path, "processors"), list);
    for (size_t i = 0; i < a.size(); ++i) load_post_processor(r, a[i], element(list, i), out);
    return;
  } else if (type == "TemplateProcessing") {
    step = load_template(r, o, path);
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    step.prefix.push_back(load_pair_id(r, o, path, "cls"));
    step.suffix.push_back(load_pair_id(r, o, path, "sep"));
  } else {
    r.fail(member(path, "type"), "unsupported post-processor " + quoted(type) +
                                     " (supported: ByteLevel, TemplateProcessing, RobertaProcessing, "
                                     "BertProcessing, Sequence)");
  }
  // Each processor of a Sequence wraps the output of the ones before it.
  out.prefix.insert(out.prefix.begin(), step.prefix.begin(), step.prefix.end());
  out.suffix.insert(out.suffix.end(), step.suffix.begin(), step.suffix.end());
}

// ---- decoder --------------------------------------------------------------------------

void load_decoder(const reader& r, const json::value& v, const std::string& path) {
  if (v.is_null()) r.fail(path, "missing: byte-level BPE needs a ByteLevel decoder");
  const json::object& o = r.object(v, path);
  const std::string_view type = r.type(o, path);
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const std::string list = member(path, "decoders");
    const json::array& a = r.array(r.require(o, path, "decoders"), list);
    if (a.empty()) r.fail(list, "empty decoder sequence");
    for (size_t i = 0; i < a.size(); ++i) load_decoder(r, a[i], element(list, i));
    return;
  }
  r.fail(member(path, "type"), "unsupported decoder " + quoted(type) + " (supported: ByteLevel, Sequence)");
}

const json::value& field_or_null(const json::object& o, std::string_view key) {
  static const json::value kNull;
  const json::value* v = o.if_contains(key);
  return v ? *v : kNull;
}

}  // namespace

bpe_tokenizer bpe_tokenizer::from_file(const std::string& path) {
  std::string error;
  std::optional<std::string> text = read_text_file(path, error);
  if (!text) throw format_error(path + ": cannot read: " + error);
  return from_json(*text, path);
}

bpe_tokenizer bpe_tokenizer::from_json(std::string_view json_text, const std::string& source) {
  // The document lives only while loading: a monotonic arena makes its 10^5 small strings
  // one bump allocation each instead of a malloc each.
  json::monotonic_resource arena;
  json::stream_parser parser;
  parser.reset(&arena);
  boost::system::error_code ec;
  const size_t consumed = parser.write_some(json_text.data(), json_text.size(), ec);
  if (!ec && consumed < json_text.size()) {
    throw format_error(source + ": not valid JSON: unexpected trailing data at byte " + std::to_string(consumed));
  }
  if (!ec) parser.finish(ec);
  if (ec) throw format_error(source + ": not valid JSON: " + ec.message() + " at byte " + std::to_string(consumed));
  const json::value doc = parser.release();
  const reader r(source);
  if (!doc.is_object()) r.fail("(top level)", "expected an object, got " + std::string(json_kind_name(doc)));
  const json::object& root = doc.get_object();

  loaded_model model = load_model(r, r.require(root, "", "model"));
  std::vector<added_token> added = load_added_tokens(r, root);

  std::vector<normalize_step> normalizers;
  load_normalizer(r, field_or_null(root, "normalizer"), "normalizer", normalizers);

  std::vector<pre_split_step> pre_steps;
  pre_tokenizer_state pre_state;
  load_pre_tokenizer(r, field_or_null(root, "pre_tokenizer"), "pre_tokenizer", pre_steps, pre_state);
  if (pre_state.byte_level_path.empty())
    r.fail("pre_tokenizer", "byte-level BPE needs a ByteLevel pre-tokenizer (alone or last in a Sequence)");
  if (pre_state.byte_level_index + 1 != pre_steps.size())
    r.fail(pre_state.byte_level_path, "ByteLevel must be the last pre-tokenizer step");

  special_affixes affixes;
  load_post_processor(r, field_or_null(root, "post_processor"), "post_processor", affixes);
  load_decoder(r, field_or_null(root, "decoder"), "decoder");

  // Per-id tables for decoding and lookups.
  int32_t max_id = model.max_id;
  for (const added_token& t : added) max_id = std::max(max_id, t.id);
  const size_t n = size_t(max_id + 1);
  std::vector<std::string> id_bytes(n), id_strings(n);
  std::vector<uint8_t> id_flags(n, 0);
  const byte_level_table& bl = byte_level_table::get();
  for (const auto& [token, id] : model.by_string) {
    // A string with characters outside the byte alphabet decodes to its own UTF-8, as the
    // ByteLevel decoder of `tokenizers` does.
    std::optional<std::string> bytes = bl.to_bytes(token);
    id_bytes[id] = bytes ? std::move(*bytes) : token;
    id_strings[id] = token;
    id_flags[id] |= impl::kKnown;
  }
  token_id_map string_to_id = std::move(model.by_string);
  bool any_single_word = false;
  for (const added_token& t : added) {
    // Added tokens decode to their content verbatim (they were matched in the raw text).
    id_bytes[t.id] = t.content;
    id_strings[t.id] = t.content;
    id_flags[t.id] = uint8_t(impl::kKnown | (t.special ? impl::kSpecial : 0));
    string_to_id[t.content] = t.id;
    any_single_word |= t.single_word;
  }
  for (const auto* ids : {&affixes.prefix, &affixes.suffix}) {
    for (const int32_t id : *ids) {
      if (size_t(id) >= n || !(id_flags[id] & impl::kKnown))
        r.fail("post_processor", "template token id " + std::to_string(id) + " is not in the vocabulary");
    }
  }

  std::shared_ptr<const split_pattern> word_char;
  if (any_single_word) word_char = compile_builtin(r, R"([\p{L}\p{N}])", "added_tokens");

  auto p = std::make_unique<impl>(bpe_model(std::move(model.spec)), added_vocabulary(std::move(added), word_char));
  p->normalizers = std::move(normalizers);
  p->pre_steps = std::move(pre_steps);
  p->prefix_ids = std::move(affixes.prefix);
  p->suffix_ids = std::move(affixes.suffix);
  p->id_bytes = std::move(id_bytes);
  p->id_strings = std::move(id_strings);
  p->id_flags = std::move(id_flags);
  p->string_to_id = std::move(string_to_id);
  return bpe_tokenizer(std::move(p));
}

}  // namespace hyserve::tokenizer
