#include "hyserve/tokenizer/incremental_detokenizer.h"

#include "hyserve/tokenizer/utf8.h"

namespace hyserve::tokenizer {

incremental_detokenizer::incremental_detokenizer(const bpe_tokenizer& tok, const decode_options& options)
    : tok_(&tok), options_(options) {}

std::string incremental_detokenizer::push(int32_t id) {
  std::string out;
  push(id, out);
  return out;
}

size_t incremental_detokenizer::push(int32_t id, std::string& out) {
  if (!tok_->is_known(id) || (options_.skip_special_tokens && tok_->is_special(id))) return 0;
  pending_.append(tok_->token_bytes(id));
  const size_t hold = utf8_incomplete_tail(pending_);
  const size_t ready = pending_.size() - hold;
  if (ready == 0) return 0;
  const size_t before = out.size();
  // Invalid bytes before the held tail can never become valid: replace them now, as the
  // whole-sequence decode would (maximal subparts end where the next token's bytes start).
  utf8_append_lossy(std::string_view(pending_).substr(0, ready), out);
  pending_.erase(0, ready);
  return out.size() - before;
}

std::string incremental_detokenizer::finish() {
  std::string out;
  utf8_append_lossy(pending_, out);
  pending_.clear();
  return out;
}

}  // namespace hyserve::tokenizer
