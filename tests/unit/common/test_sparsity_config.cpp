// The `sparsity` section (docs/ARCHITECTURE.md, Sparse Top-K attention): algorithm quest | none, page_budget, sink_pages,
// recent_pages, min_seq_len, validated at load with messages naming the field.
#include <gtest/gtest.h>

#include <string>

#include "common_test_support.h"
#include "hyserve/common/config.h"
#include "hyserve/common/error.h"

namespace hyserve {
namespace {

const std::string kModel = "model: {path: /ckpt}\n";

TEST(SparsityConfig, ParsesEveryField) {
  const service_config c = load_config_string(
      kModel + "sparsity: {algorithm: quest, page_budget: 256, sink_pages: 4, recent_pages: 8, min_seq_len: 4096}");
  EXPECT_EQ(c.sparsity.algorithm, sparsity_algorithm::kQuest);
  EXPECT_EQ(c.sparsity.page_budget, 256);
  EXPECT_EQ(c.sparsity.sink_pages, 4);
  EXPECT_EQ(c.sparsity.recent_pages, 8);
  EXPECT_EQ(c.sparsity.min_seq_len, 4096);
  const service_config n = load_config_string(kModel + "sparsity: {algorithm: none}");
  EXPECT_EQ(n.sparsity.algorithm, sparsity_algorithm::kNone);
}

TEST(SparsityConfig, DefaultsAreDenseAndConsistent) {
  const service_config c = load_config_string(kModel);
  EXPECT_EQ(c.sparsity.algorithm, sparsity_algorithm::kNone);
  EXPECT_GE(c.sparsity.page_budget, c.sparsity.sink_pages + c.sparsity.recent_pages + 1);
  // Defaults of the unspecified fields are kept when only the algorithm is given.
  const service_config q = load_config_string(kModel + "sparsity: {algorithm: quest}");
  EXPECT_EQ(q.sparsity.algorithm, sparsity_algorithm::kQuest);
  EXPECT_EQ(q.sparsity.page_budget, c.sparsity.page_budget);
  EXPECT_EQ(q.sparsity.min_seq_len, c.sparsity.min_seq_len);
}

TEST(SparsityConfig, UnknownAlgorithmListsTheKnownOnes) {
  EXPECT_ERROR_WITH(load_config_string(kModel + "sparsity: {algorithm: topk}"), config_error,
                    "sparsity.algorithm", "unknown algorithm 'topk'", "known: none, quest");
}

TEST(SparsityConfig, BudgetMustExceedSinkPlusRecent) {
  EXPECT_ERROR_WITH(
      load_config_string(kModel + "sparsity: {algorithm: quest, page_budget: 6, sink_pages: 2, recent_pages: 4}"),
      config_error, "sparsity.page_budget", "sink_pages + recent_pages + 1 = 7", "got 6");
  // The limit follows whichever field is raised; a budget exactly at it is accepted.
  EXPECT_ERROR_WITH(load_config_string(kModel + "sparsity: {page_budget: 8, recent_pages: 8}"), config_error,
                    "sparsity.page_budget", "recent_pages");
  const service_config c =
      load_config_string(kModel + "sparsity: {algorithm: quest, page_budget: 7, sink_pages: 2, recent_pages: 4}");
  EXPECT_EQ(c.sparsity.page_budget, 7);
}

TEST(SparsityConfig, RejectsOutOfRangeAndUnknownFields) {
  EXPECT_ERROR_WITH(load_config_string(kModel + "sparsity: {page_budget: 0}"), config_error, "sparsity.page_budget",
                    "must be >= 1");
  EXPECT_ERROR_WITH(load_config_string(kModel + "sparsity: {sink_pages: -1}"), config_error, "sparsity.sink_pages",
                    "must be >= 0");
  EXPECT_ERROR_WITH(load_config_string(kModel + "sparsity: {recent_pages: -2}"), config_error,
                    "sparsity.recent_pages", "must be >= 0");
  EXPECT_ERROR_WITH(load_config_string(kModel + "sparsity: {min_seq_len: -5}"), config_error, "sparsity.min_seq_len",
                    "must be >= 0");
  EXPECT_ERROR_WITH(load_config_string(kModel + "sparsity: {page_budget: many}"), config_error,
                    "sparsity.page_budget");
  EXPECT_ERROR_WITH(load_config_string(kModel + "sparsity: {top_k: 4}"), config_error, "sparsity.top_k",
                    "unknown key");
}

}  // namespace
}  // namespace hyserve
