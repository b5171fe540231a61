#pragma once
// The decode queries a tree verify call's draft nodes stand for. Node j of row b attends the
// row's first prefix = seq_lens[b] − nodes keys, then its ancestors root .. itself (parents
// precede their children; -1 is the root's parent). As a decode query it is a row of
// prefix + depth + 1 keys whose last depth + 1 positions hold those ancestors' K/V: this copies
// them into pages of its own, so one decode call (one query per node, in the tree call's query
// order) computes what the decode step at each node's position would. Cache elements T (float,
// or bf16 bits as uint16_t), kv_row elements per token.
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace hyserve::test_support {

// A tree verify call's layout: `batch` rows of `nodes` queries each (query_start_loc) and a
// random tree per row (parent: -1 for node 0, then a random earlier node).
struct random_tree_layout {
  std::vector<int32_t> query_start_loc, parent;
};

inline random_tree_layout random_trees(int64_t batch, int64_t nodes, std::mt19937& rng) {
  random_tree_layout t;
  t.query_start_loc.push_back(0);
  for (int64_t b = 0; b < batch; ++b) {
    t.query_start_loc.push_back(static_cast<int32_t>((b + 1) * nodes));
    t.parent.push_back(-1);
    for (int64_t j = 1; j < nodes; ++j) t.parent.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(j)));
  }
  return t;
}

template <class T>
struct tree_decode_rows {
  std::vector<T> k, v;                       // [pages · page_size, kv_row]
  std::vector<int32_t> page_table;           // [batch · nodes, stride]
  std::vector<int32_t> seq_lens;             // [batch · nodes]
  std::vector<int32_t> query_start_loc;      // 0, 1, .., batch · nodes
  int64_t stride = 0;
};

template <class T>
tree_decode_rows<T> tree_as_decode_rows(const std::vector<T>& k, const std::vector<T>& v,
                                        const std::vector<int32_t>& page_table, int64_t table_stride,
                                        const std::vector<int32_t>& seq_lens, const std::vector<int32_t>& parent,
                                        int64_t nodes, int64_t page_size, int64_t kv_row) {
  const int64_t batch = static_cast<int64_t>(seq_lens.size());
  tree_decode_rows<T> r;
  int64_t max_len = 0;
  for (const int32_t len : seq_lens) max_len = std::max<int64_t>(max_len, len);
  r.stride = (max_len + page_size - 1) / page_size;
  r.page_table.assign(static_cast<size_t>(batch * nodes * r.stride), 0);
  r.query_start_loc.push_back(0);
  int64_t next_page = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t prefix = seq_lens[static_cast<size_t>(b)] - nodes;
    for (int64_t j = 0; j < nodes; ++j) {
      std::vector<int64_t> path;  // itself .. root
      for (int64_t a = j; a >= 0; a = parent[static_cast<size_t>(b * nodes + a)]) path.push_back(a);
      const int64_t len = prefix + static_cast<int64_t>(path.size()), row = b * nodes + j;
      r.seq_lens.push_back(static_cast<int32_t>(len));
      r.query_start_loc.push_back(static_cast<int32_t>(row + 1));
      const int64_t n_pages = (len + page_size - 1) / page_size;
      for (int64_t i = 0; i < n_pages; ++i)
        r.page_table[static_cast<size_t>(row * r.stride + i)] = static_cast<int32_t>(next_page + i);
      r.k.resize(static_cast<size_t>((next_page + n_pages) * page_size * kv_row));
      r.v.resize(r.k.size());
      for (int64_t s = 0; s < len; ++s) {
        const int64_t src_pos = s < prefix ? s : prefix + path[path.size() - 1 - static_cast<size_t>(s - prefix)];
        const int64_t src = (static_cast<int64_t>(page_table[static_cast<size_t>(b * table_stride + src_pos / page_size)]) *
                                 page_size +
                             src_pos % page_size) *
                            kv_row;
        const int64_t dst = ((next_page + s / page_size) * page_size + s % page_size) * kv_row;
        for (int64_t e = 0; e < kv_row; ++e) {
          r.k[static_cast<size_t>(dst + e)] = k[static_cast<size_t>(src + e)];
          r.v[static_cast<size_t>(dst + e)] = v[static_cast<size_t>(src + e)];
        }
      }
      next_page += n_pages;
    }
  }
  return r;
}

}  // namespace hyserve::test_support
