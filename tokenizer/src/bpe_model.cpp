#include "bpe_model.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace hyserve::tokenizer {

namespace {

// 64-bit hash of a short byte string: 8-byte blocks mixed with multiply-xorshift.
uint64_t hash_bytes(std::string_view s) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t h = 0x243F6A8885A308D3ull ^ (s.size() * kMul);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
  }
  if (i < s.size()) {
    uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
  }
  h *= kMul;
  return h ^ (h >> 32);
}

// Heap order: the lowest rank first, then the leftmost position (std heaps are max-heaps).
bool lower_priority(const bpe_scratch::candidate& a, const bpe_scratch::candidate& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
}

// Cache of 2^13 words (512 KiB): the frequent words of a text, small enough to stay in L2.
constexpr size_t kCacheLog2 = 13;

}  // namespace

// ---- merge_table ----------------------------------------------------------------------

void merge_table::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  if (cap > slots_.size()) rehash(cap);
}

void merge_table::rehash(size_t capacity) {
  std::vector<slot> old = std::move(slots_);
  slots_.assign(capacity, slot{});
  mask_ = capacity - 1;
  shift_ = 64 - std::countr_zero(capacity);
  size_ = 0;
  for (const slot& s : old)
    if (s.key != kEmpty) insert_or_assign(int32_t(s.key >> 32), int32_t(uint32_t(s.key)), s.value);
}

void merge_table::insert_or_assign(int32_t left, int32_t right, merge m) {
  if ((size_ + 1) * 2 > slots_.size()) rehash(std::max<size_t>(16, slots_.size() * 2));
  const uint64_t key = pack(left, right);
  for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
    slot& s = slots_[i];
    if (s.key == key) {
      s.value = m;
      return;
    }
    if (s.key == kEmpty) {
      s.key = key;
      s.value = m;
      ++size_;
      return;
    }
  }
}

// ---- word_cache -----------------------------------------------------------------------

word_cache::word_cache(size_t capacity_log2) : entries_(size_t{1} << capacity_log2), shift_(64 - int(capacity_log2)) {}

bool word_cache::lookup(std::string_view word, uint64_t hash, std::vector<int32_t>& out) const {
  const size_t i = index(hash);
  int32_t ids[kMaxIds];
  size_t n = 0;
  {
    std::lock_guard<stripe_lock> lock(locks_[i % kStripes]);
    const entry& e = entries_[i];
    if (e.n_ids == 0 || e.hash != hash || e.word_len != word.size() ||
        std::memcmp(e.word, word.data(), word.size()) != 0)
      return false;
    n = e.n_ids;
    std::memcpy(ids, e.ids, n * sizeof(int32_t));
  }
  for (size_t k = 0; k < n; ++k) out.push_back(ids[k]);
  return true;
}

void word_cache::insert(std::string_view word, uint64_t hash, const int32_t* ids, size_t n) {
  if (word.size() > kMaxWordBytes || n == 0 || n > kMaxIds) return;
  const size_t i = index(hash);
  std::lock_guard<stripe_lock> lock(locks_[i % kStripes]);
  entry& e = entries_[i];
  e.hash = hash;
  e.word_len = uint8_t(word.size());
  e.n_ids = uint8_t(n);
  std::memcpy(e.word, word.data(), word.size());
  std::memcpy(e.ids, ids, n * sizeof(int32_t));
}

// ---- bpe_model ------------------------------------------------------------------------

bpe_model::bpe_model(bpe_model_spec spec)
    : byte_ids_(spec.byte_ids),
      bytes_to_id_(std::move(spec.bytes_to_id)),
      unk_id_(spec.unk_id),
      fuse_unk_(spec.fuse_unk),
      ignore_merges_(spec.ignore_merges),
      cache_(std::make_unique<word_cache>(kCacheLog2)) {
  merges_.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& m = spec.merges[rank];
    merges_.insert_or_assign(m.left, m.right, {uint32_t(rank), m.merged});
  }
}

void bpe_model::encode_word(std::string_view word, bpe_scratch& scratch, std::vector<int32_t>& out) const {
  if (word.size() == 1 || (word.size() == 2 && !ignore_merges_)) {
    // At most one merge: cheaper than the cache. (With ignore_merges a two-byte word may be
    // a token no merge reaches, so it takes the general path.)
    const int32_t a = byte_ids_[static_cast<uint8_t>(word[0])];
    if (word.size() == 1 && a >= 0) {
      out.push_back(a);
      return;
    }
    const int32_t b = word.size() == 2 ? byte_ids_[static_cast<uint8_t>(word[1])] : -1;
    if (a >= 0 && b >= 0) {
      if (const merge_table::merge* m = merges_.find(a, b)) {
        out.push_back(m->new_id);
      } else {
        out.push_back(a);
        out.push_back(b);
      }
      return;
    }
  }
  const bool cacheable = word.size() <= word_cache::kMaxWordBytes;
  const uint64_t h = cacheable ? hash_bytes(word) : 0;
  if (cacheable && cache_->lookup(word, h, out)) return;
  const size_t first = out.size();
  // Llama-3 style: a word that is itself a token is emitted whole, merges or not.
  const auto whole = ignore_merges_ ? bytes_to_id_.find(word) : bytes_to_id_.end();
  if (whole != bytes_to_id_.end()) {
    out.push_back(whole->second);
  } else {
    merge_word(word, scratch, out);
  }
  if (cacheable) cache_->insert(word, h, out.data() + first, out.size() - first);
}

// Same algorithm as Word::merge_all in `tokenizers`, including how stale heap entries are
// recognised (the pair at the position no longer merges into the entry's id), so equal-rank
// ties and overlapping pairs ("aaa") resolve identically.
void bpe_model::merge_word(std::string_view word, bpe_scratch& scratch, std::vector<int32_t>& out) const {
  auto& sym = scratch.symbols;
  sym.clear();
  bool prev_unknown = false;
  for (const char ch : word) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(ch)];
    if (id >= 0) {
      sym.push_back({id, 0, 0, true});
      prev_unknown = false;
      continue;
    }
    if (unk_id_ < 0) continue;  // no unk token: the byte is dropped
    if (!(fuse_unk_ && prev_unknown)) sym.push_back({unk_id_, 0, 0, true});
    prev_unknown = true;
  }
  const int32_t n = int32_t(sym.size());
  for (int32_t i = 0; i < n; ++i) {
    sym[i].prev = i - 1;
    sym[i].next = i + 1 < n ? i + 1 : -1;
  }

  auto& heap = scratch.heap;
  heap.clear();
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const merge_table::merge* m = merges_.find(sym[i].id, sym[i + 1].id))
      heap.push_back({m->rank, uint32_t(i), m->new_id});
  }
  std::make_heap(heap.begin(), heap.end(), lower_priority);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), lower_priority);
    const bpe_scratch::candidate top = heap.back();
    heap.pop_back();
    bpe_scratch::symbol& left = sym[top.pos];
    if (!left.live || left.next < 0) continue;
    const int32_t right_pos = left.next;
    const bpe_scratch::symbol right = sym[right_pos];
    const merge_table::merge* m = merges_.find(left.id, right.id);
    if (!m || m->new_id != top.new_id) continue;  // stale entry

    left.id = top.new_id;
    left.next = right.next;
    sym[right_pos].live = false;
    if (right.next >= 0) sym[right.next].prev = int32_t(top.pos);

    if (left.prev >= 0) {
      if (const merge_table::merge* pm = merges_.find(sym[left.prev].id, left.id)) {
        heap.push_back({pm->rank, uint32_t(left.prev), pm->new_id});
        std::push_heap(heap.begin(), heap.end(), lower_priority);
      }
    }
    if (left.next >= 0) {
      if (const merge_table::merge* nm = merges_.find(left.id, sym[left.next].id)) {
        heap.push_back({nm->rank, top.pos, nm->new_id});
        std::push_heap(heap.begin(), heap.end(), lower_priority);
      }
    }
  }
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

}  // namespace hyserve::tokenizer
