#include "pre_tokenizer.h"

namespace hyserve::tokenizer {

std::string normalize(const std::vector<normalize_step>& steps, std::string_view text, match_scratch& match) {
  std::string cur(text);
  std::string next;
  for (const normalize_step& s : steps) {
    switch (s.kind) {
      case normalize_step::kind_t::kPrepend:
        if (!cur.empty()) cur.insert(0, s.text);
        break;
      case normalize_step::kind_t::kReplace: {
        next.clear();
        size_t prev = 0;
        text_range m{};
        while (prev < cur.size() && s.pattern->find_next(cur, prev, match, m)) {
          next.append(cur, prev, m.begin - prev);
          next.append(s.text);
          prev = m.end;
        }
        next.append(cur, prev, std::string::npos);
        cur.swap(next);
        break;
      }
    }
  }
  return cur;
}

}  // namespace hyserve::tokenizer
