// The per-request sparse attention override (docs/ARCHITECTURE.md, Sparse Top-K attention): sampling field `sparse`, a boolean,
// default true; anything else is a 400 naming the field.
#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <string>

#include "coordinator/api/validation.h"

namespace hyserve::coordinator::api {
namespace {

model_info info() {
  model_info m;
  m.vocab_size = 1000;
  m.max_context = 256;
  return m;
}

std::optional<api_error> read(const std::string& body, const std::string& prefix, sampling_params& out) {
  sampling_keys keys;
  keys.prefix = prefix;
  bool given = false;
  return read_sampling(boost::json::parse(body).as_object(), keys, info(), out, given);
}

TEST(SparseField, DefaultsToSparse) {
  sampling_params p;
  EXPECT_FALSE(read(R"({"temperature": 0})", "", p));
  EXPECT_TRUE(p.sparse);
}

TEST(SparseField, FalseAndTrueAreRead) {
  sampling_params p;
  EXPECT_FALSE(read(R"({"sparse": false})", "sampling_params.", p));
  EXPECT_FALSE(p.sparse);
  EXPECT_FALSE(read(R"({"sparse": true})", "sampling_params.", p));
  EXPECT_TRUE(p.sparse);
}

TEST(SparseField, NonBooleanIsA400NamingTheField) {
  for (const std::string v : {"0", "1", "\"false\"", "[]", "{}", "0.5"}) {
    for (const std::string prefix : {"", "sampling_params."}) {
      sampling_params p;
      const auto e = read(R"({"sparse": )" + v + "}", prefix, p);
      ASSERT_TRUE(e.has_value()) << v;
      EXPECT_EQ(e->status, 400u);
      EXPECT_EQ(e->param, prefix + "sparse");
      EXPECT_NE(e->message.find(prefix + "sparse must be a boolean"), std::string::npos) << e->message;
      EXPECT_TRUE(p.sparse) << "a rejected value leaves the default";
    }
  }
}

}  // namespace
}  // namespace hyserve::coordinator::api
