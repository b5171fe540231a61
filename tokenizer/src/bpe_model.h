#pragma once
// The BPE model on raw bytes: each pre-tokenized word starts as one symbol per byte and the
// adjacent pair with the lowest merge rank is merged until none is left. Pairs live in a heap
// keyed by (rank, position) over a doubly linked list of symbols, so a word of n bytes costs
// O(n log n) rather than the O(n^2) rescan loop; whole words are memoised in a bounded cache.
// Internal to the tokenizer library.
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace hyserve::tokenizer {

// Token string -> id, looked up by string_view without allocating.
struct string_hash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using token_id_map = std::unordered_map<std::string, int32_t, string_hash, std::equal_to<>>;

// Open-addressing map (left id, right id) -> (rank, merged id).
class merge_table {
 public:
  struct merge {
    uint32_t rank;
    int32_t new_id;
  };
  void reserve(size_t n);
  // A pair seen again replaces the earlier entry (the last duplicate wins, as in `tokenizers`).
  void insert_or_assign(int32_t left, int32_t right, merge m);
  const merge* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = pack(left, right);
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct slot {
    uint64_t key = kEmpty;
    merge value{};
  };
  static uint64_t pack(int32_t l, int32_t r) { return (uint64_t(uint32_t(l)) << 32) | uint32_t(r); }
  size_t slot_of(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  void rehash(size_t capacity);
  std::vector<slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

// Bounded, thread-safe memo of word -> ids: direct-mapped (a new word evicts the one in its
// slot), striped spin locks (held for a 64-byte copy), one 64-byte line per entry so a lookup touches one cache line. Words
// longer than kMaxWordBytes or with more than kMaxIds tokens are not cached (rare in text,
// and then the merge loop is cheap next to their length anyway).
class word_cache {
 public:
  static constexpr size_t kMaxWordBytes = 22;
  static constexpr size_t kMaxIds = 8;
  explicit word_cache(size_t capacity_log2);
  // Appends the cached ids of `word` to `out`; false on a miss.
  bool lookup(std::string_view word, uint64_t hash, std::vector<int32_t>& out) const;
  void insert(std::string_view word, uint64_t hash, const int32_t* ids, size_t n);

 private:
  struct alignas(64) entry {
    uint64_t hash = 0;
    uint8_t word_len = 0;
    uint8_t n_ids = 0;  // 0: slot unused (every cached word has at least one id)
    char word[kMaxWordBytes];
    int32_t ids[kMaxIds];
  };
  static_assert(sizeof(entry) == 64);
  static constexpr size_t kStripes = 64;
  size_t index(uint64_t hash) const { return size_t(hash >> shift_); }
  std::vector<entry> entries_;
  int shift_;
  // A spin lock: the critical sections copy one cache line, so an uncontended acquire (one
  // atomic exchange, no call) is what matters; a waiter yields rather than burning its core.
  struct stripe_lock {
    std::atomic<bool> held{false};
    void lock() {
      while (held.exchange(true, std::memory_order_acquire)) {
        while (held.load(std::memory_order_relaxed)) std::this_thread::yield();
      }
    }
    void unlock() { held.store(false, std::memory_order_release); }
  };
  mutable std::array<stripe_lock, kStripes> locks_;
};

// Per-call buffers of the merge loop.
struct bpe_scratch {
  struct symbol {
    int32_t id;
    int32_t prev;  // index of the previous live symbol, -1 at the start
    int32_t next;  // index of the next live symbol, -1 at the end
    bool live;
  };
  struct candidate {
    uint32_t rank;
    uint32_t pos;  // index of the left symbol
    int32_t new_id;
  };
  std::vector<symbol> symbols;
  std::vector<candidate> heap;
};

struct bpe_model_spec {
  std::array<int32_t, 256> byte_ids;  // id of the token of each single byte, -1 when absent
  // Merges in rank order (rank = index): left id, right id, merged id.
  struct merge_rule {
    int32_t left, right, merged;
  };
  std::vector<merge_rule> merges;
  // Raw bytes -> id of every vocabulary token that byte-level text can produce; filled only
  // for ignore_merges.
  token_id_map bytes_to_id;
  int32_t unk_id = -1;  // -1: bytes without a token are dropped
  bool fuse_unk = false;
  bool ignore_merges = false;
};

class bpe_model {
 public:
  explicit bpe_model(bpe_model_spec spec);

  // Appends the ids of one pre-tokenized word (raw bytes, non-empty) to `out`.
  void encode_word(std::string_view word, bpe_scratch& scratch, std::vector<int32_t>& out) const;

 private:
  void merge_word(std::string_view word, bpe_scratch& scratch, std::vector<int32_t>& out) const;

  std::array<int32_t, 256> byte_ids_;
  merge_table merges_;
  token_id_map bytes_to_id_;
  int32_t unk_id_;
  bool fuse_unk_;
  bool ignore_merges_;
  std::unique_ptr<word_cache> cache_;
};

}  // namespace hyserve::tokenizer
