#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common_test_support.h"
#include "hyserve/common/dtype.h"
#include "hyserve/common/error.h"
#include "hyserve/common/safetensors.h"

namespace hyserve {
namespace {

using test::build_safetensors;
using test::raw_bytes;
using test::safetensors_bytes;
using test::scratch_dir;
using test::st_tensor;
using test::write_file;

std::vector<float> iota_f32(size_t n, float start = 0.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

// ---- the real checkpoint ----------------------------------------------------------------------

TEST(Safetensors, FixtureOpensWithExpectedTensors) {
  const auto f = safetensors_file::open(test::fixture_dir() + "/model.safetensors");
  const auto names = f.names();
  EXPECT_EQ(names.size(), 51u);
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_TRUE(f.contains("lm_head.weight"));
  EXPECT_FALSE(f.contains("model.layers.1.mamba.D"));  // layer 1 is attention
  EXPECT_EQ(f.info("model.layers.0.mamba.D").shape, (shape_t{4}));
  EXPECT_EQ(f.info("model.layers.0.mamba.in_proj.weight").shape, (shape_t{292, 64}));
  EXPECT_EQ(f.info("model.layers.0.mamba.conv1d.weight").shape, (shape_t{160, 1, 4}));
  EXPECT_EQ(f.info("model.layers.1.self_attn.k_proj.weight").shape, (shape_t{32, 64}));
  EXPECT_EQ(f.info("model.embed_tokens.weight").type, dtype::kF32);
}

TEST(Safetensors, FixtureValuesAreSane) {
  const auto f = safetensors_file::open(test::fixture_dir() + "/model.safetensors");
  const host_tensor d = f.load_f32("model.layers.0.mamba.D", shape_t{4});
  for (int i = 0; i < 4; ++i) EXPECT_EQ(d.as<float>()[i], 1.0f);
  // A_log was initialised to log(1..n_heads).
  const host_tensor a_log = f.load_f32("model.layers.2.mamba.A_log", shape_t{4});
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(a_log.as<float>()[i], std::log(static_cast<float>(i + 1)), 1e-6f);
  const host_tensor lm = f.load_f32("lm_head.weight", shape_t{512, 64});
  EXPECT_NEAR(lm.as<float>()[0], 0.046837229f, 1e-7f);
  EXPECT_NEAR(lm.as<float>()[64 * 511 + 63], 0.0592396f, 1e-6f);
}

TEST(Safetensors, FixtureSliceMatchesFullTensor) {
  const auto f = safetensors_file::open(test::fixture_dir() + "/model.safetensors");
  const shape_t full{292, 64};
  const host_tensor all = f.load_f32("model.layers.0.mamba.in_proj.weight", full);
  const host_tensor rows = f.load_f32_slice("model.layers.0.mamba.in_proj.weight", full, 0, 128, 160);
  ASSERT_EQ(rows.shape(), (shape_t{32, 64}));
  for (int64_t i = 0; i < rows.numel(); ++i) ASSERT_EQ(rows.as<float>()[i], all.as<float>()[128 * 64 + i]) << i;
  const host_tensor cols = f.load_f32_slice("model.layers.0.mamba.in_proj.weight", full, 1, 16, 48);
  ASSERT_EQ(cols.shape(), (shape_t{292, 32}));
  for (int64_t r = 0; r < 292; ++r)
    for (int64_t c = 0; c < 32; ++c) ASSERT_EQ(cols.as<float>()[r * 32 + c], all.as<float>()[r * 64 + 16 + c]);
}

TEST(Checkpoint, FixtureDirectoryUsesModelFileOnly) {
  const auto ck = checkpoint::open_dir(test::fixture_dir());
  EXPECT_TRUE(ck.contains("model.embed_tokens.weight"));
  EXPECT_FALSE(ck.contains("full_logits.0"));  // reference.safetensors is not a weight file
  const host_tensor w = ck.load_f32("model.final_layernorm.weight", shape_t{64});
  EXPECT_EQ(w.as<float>()[63], 1.0f);
  const host_tensor s = ck.load_f32_slice("model.layers.1.self_attn.q_proj.weight", shape_t{64, 64}, 0, 0, 32);
  EXPECT_EQ(s.shape(), (shape_t{32, 64}));
  EXPECT_ERROR_WITH((void)ck.file_of("nope.weight"), format_error, "nope.weight", "bamba-tiny");
}

// ---- written files: conversions and slices ----------------------------------------------------

TEST(Safetensors, ConvertsBf16AndF16ToF32) {
  scratch_dir dir;
  const std::vector<float> values{0.0f, 1.0f, -2.5f, 0.15625f, 65504.0f, -0.0009765625f};
  std::vector<uint16_t> bf16, f16;
  for (float v : values) {
    bf16.push_back(f32_to_bf16(v));
    f16.push_back(f32_to_f16(v));
  }
  const std::string p = dir.file("mixed.safetensors");
  write_file(p, build_safetensors({{"a.bf16", "BF16", {2, 3}, raw_bytes(bf16)},
                                   {"b.f16", "F16", {2, 3}, raw_bytes(f16)},
                                   {"c.f32", "F32", {6}, raw_bytes(values)}}));
  const auto f = safetensors_file::open(p);
  EXPECT_EQ(f.info("a.bf16").type, dtype::kBF16);
  EXPECT_EQ(f.info("b.f16").type, dtype::kF16);
  const host_tensor a = f.load_f32("a.bf16", shape_t{2, 3});
  const host_tensor b = f.load_f32("b.f16", shape_t{2, 3});
  const host_tensor c = f.load_f32("c.f32", shape_t{6});
  for (size_t i = 0; i < values.size(); ++i) {
    const int k = static_cast<int>(i);
    EXPECT_EQ(a.as<float>()[k], bf16_to_f32(bf16[i])) << i;
    EXPECT_NEAR(a.as<float>()[k], values[i], std::fabs(values[i]) / 128.0f) << i;
    EXPECT_EQ(b.as<float>()[k], values[i]) << i;  // all exactly representable in f16
    EXPECT_EQ(c.as<float>()[k], values[i]) << i;
  }
  // The bf16 slice reads columns 1..2 of both rows.
  const host_tensor s = f.load_f32_slice("a.bf16", shape_t{2, 3}, 1, 1, 3);
  ASSERT_EQ(s.shape(), (shape_t{2, 2}));
  EXPECT_EQ(s.as<float>()[0], a.as<float>()[1]);
  EXPECT_EQ(s.as<float>()[3], a.as<float>()[5]);
}

TEST(Safetensors, UnalignedDataSectionIsReadCorrectly) {
  // Header of odd length: the data section starts at an address not aligned to 4.
  scratch_dir dir;
  const std::vector<float> v = iota_f32(5, 0.5f);
  const std::string header = R"({"x":{"dtype":"F32","shape":[5],"data_offsets":[0,20]}} )";  // 1 padding space
  const std::string p = dir.file("odd.safetensors");
  write_file(p, safetensors_bytes(header, raw_bytes(v)));
  const host_tensor t = safetensors_file::open(p).load_f32("x", shape_t{5});
  for (int i = 0; i < 5; ++i) EXPECT_EQ(t.as<float>()[i], v[static_cast<size_t>(i)]);
}

TEST(Safetensors, IntegerTensorsAreRawOnly) {
  scratch_dir dir;
  const std::vector<int32_t> ids{7, -1, 3};
  const std::vector<int64_t> big{1ll << 40};
  const std::string p = dir.file("ints.safetensors");
  write_file(p, build_safetensors({{"ids", "I32", {3}, raw_bytes(ids)}, {"big", "I64", {1}, raw_bytes(big)}}));
  const auto f = safetensors_file::open(p);
  EXPECT_EQ(f.info("ids").type, dtype::kI32);
  int32_t second = 0;  // the data section of a written file need not be 4-byte aligned
  std::memcpy(&second, static_cast<const uint8_t*>(f.data("ids")) + 4, 4);
  EXPECT_EQ(second, -1);
  int64_t b = 0;
  std::memcpy(&b, f.data("big"), 8);
  EXPECT_EQ(b, 1ll << 40);
  EXPECT_ERROR_WITH((void)f.load_f32("ids", shape_t{3}), format_error, p, "tensor ids", "I32");
}

TEST(Safetensors, EmptyTensorsAndMetadataAreAccepted) {
  scratch_dir dir;
  const std::string p = dir.file("empty.safetensors");
  write_file(p, build_safetensors({{"e", "F32", {0, 4}, ""}, {"s", "F32", {}, raw_bytes(std::vector<float>{3.0f})}}));
  const auto f = safetensors_file::open(p);
  EXPECT_EQ(f.info("e").shape, (shape_t{0, 4}));
  EXPECT_EQ(f.load_f32("s", shape_t{}).as<float>()[0], 3.0f);  // rank-0 scalar
  EXPECT_EQ(f.names(), (std::vector<std::string>{"e", "s"}));  // __metadata__ is not a tensor
}

// ---- written files: every way a file can be broken --------------------------------------------

TEST(SafetensorsErrors, MissingFile) {
  EXPECT_ERROR_WITH((void)safetensors_file::open("/nonexistent/x.safetensors"), format_error,
                    "/nonexistent/x.safetensors", "cannot open");
}

TEST(SafetensorsErrors, FileShorterThanHeaderLength) {
  scratch_dir dir;
  const std::string p = dir.file("short.safetensors");
  write_file(p, "abc");
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "3 bytes", "too small");
  write_file(p, "");
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "0 bytes");
}

TEST(SafetensorsErrors, HeaderLengthPastEndOfFile) {
  scratch_dir dir;
  const std::string p = dir.file("long_header.safetensors");
  const std::string bytes = safetensors_bytes(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "");
  write_file(p, bytes.substr(0, 20));  // header cut short
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "header length 54 past end of file (size 20)");
  std::string huge(8, '\xff');  // 2^64 - 1
  write_file(p, huge + "{}");
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "header length 18446744073709551615",
                    "(size 10)");
}

TEST(SafetensorsErrors, TruncatedDataSection) {
  scratch_dir dir;
  const std::string p = dir.file("truncated.safetensors");
  std::string bytes = build_safetensors({{"w", "F32", {4, 4}, raw_bytes(iota_f32(16))}});
  bytes.resize(bytes.size() - 10);
  write_file(p, bytes);
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "tensor w", "past end of data section");
}

TEST(SafetensorsErrors, HeaderIsNotJson) {
  scratch_dir dir;
  const std::string p = dir.file("bad_json.safetensors");
  write_file(p, safetensors_bytes(R"({"x": {"dtype": "F32",)", ""));
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "not valid JSON");
  write_file(p, safetensors_bytes("[1, 2]", ""));
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "not a JSON object");
  write_file(p, safetensors_bytes("{} trailing", ""));
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "JSON");
}

TEST(SafetensorsErrors, OffsetsOutOfRange) {
  scratch_dir dir;
  const std::string p = dir.file("offsets.safetensors");
  write_file(p, safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", std::string(8, '\0')));
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "tensor w", "[8, 16]",
                    "past end of data section (8 bytes)");
  write_file(p, safetensors_bytes(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", std::string(8, '\0')));
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "tensor w", "begin > end");
  write_file(p, safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-4,4]}})", std::string(8, '\0')));
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "tensor w", "non-negative");
  write_file(p, safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", std::string(8, '\0')));
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "tensor w", "[begin, end]");
}

TEST(SafetensorsErrors, ByteRangeDoesNotMatchShapeTimesDtype) {
  scratch_dir dir;
  const std::string p = dir.file("size.safetensors");
  write_file(p,
             safetensors_bytes(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,24]}})", std::string(24, '\0')));
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "tensor w", "24 bytes", "[2, 3]", "BF16",
                    "= 12 bytes");
}

TEST(SafetensorsErrors, BadShape) {
  scratch_dir dir;
  const std::string p = dir.file("shape.safetensors");
  write_file(p, safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,0]}})", ""));
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "tensor w", "non-negative integers");
  write_file(p, safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1,1,1,1,1,1,1],"data_offsets":[0,4]}})",
                                  std::string(4, '\0')));
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "tensor w", "rank 7");
  write_file(p, safetensors_bytes(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", std::string(4, '\0')));
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "tensor w", "missing \"shape\"");
}

TEST(SafetensorsErrors, UnknownDtype) {
  scratch_dir dir;
  const std::string p = dir.file("dtype.safetensors");
  write_file(p, safetensors_bytes(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0')));
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "tensor w", "unsupported dtype 'F64'",
                    "F32, BF16, F16, I32, I64");
}

TEST(SafetensorsErrors, OverlappingRanges) {
  scratch_dir dir;
  const std::string p = dir.file("overlap.safetensors");
  write_file(p, safetensors_bytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                  std::string(16, '\0')));
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "'a' [0, 16)", "'b' [8, 16)", "overlap");
}

TEST(SafetensorsErrors, BadMetadata) {
  scratch_dir dir;
  const std::string p = dir.file("meta.safetensors");
  write_file(p, safetensors_bytes(R"({"__metadata__":{"format":1}})", ""));
  EXPECT_ERROR_WITH((void)safetensors_file::open(p), format_error, p, "__metadata__", "format");
}

TEST(SafetensorsErrors, MissingTensorAndWrongShape) {
  scratch_dir dir;
  const std::string p = dir.file("w.safetensors");
  write_file(p, build_safetensors({{"w", "F32", {2, 3}, raw_bytes(iota_f32(6))}}));
  const auto f = safetensors_file::open(p);
  EXPECT_ERROR_WITH((void)f.info("v"), format_error, p, "tensor v", "not found");
  EXPECT_ERROR_WITH((void)f.data("v"), format_error, p, "tensor v");
  EXPECT_ERROR_WITH((void)f.load_f32("v", shape_t{2, 3}), format_error, p, "tensor v", "not found");
  EXPECT_ERROR_WITH((void)f.load_f32("w", shape_t{3, 2}), format_error, p,
                    "tensor w: expected shape [3, 2], got [2, 3]");
  EXPECT_ERROR_WITH((void)f.load_f32_slice("w", shape_t{6}, 0, 0, 1), format_error, p,
                    "tensor w: expected shape [6], got [2, 3]");
}

TEST(SafetensorsErrors, SliceOutOfRange) {
  scratch_dir dir;
  const std::string p = dir.file("w.safetensors");
  write_file(p, build_safetensors({{"w", "F32", {2, 3}, raw_bytes(iota_f32(6))}}));
  const auto f = safetensors_file::open(p);
  EXPECT_ERROR_WITH((void)f.load_f32_slice("w", shape_t{2, 3}, 2, 0, 1), invalid_argument_error, "tensor w",
                    "dimension 2");
  EXPECT_ERROR_WITH((void)f.load_f32_slice("w", shape_t{2, 3}, 1, 2, 4), invalid_argument_error, "tensor w", "[2, 4)");
  EXPECT_ERROR_WITH((void)f.load_f32_slice("w", shape_t{2, 3}, 0, 1, 0), invalid_argument_error, "tensor w");
  const host_tensor empty = f.load_f32_slice("w", shape_t{2, 3}, 0, 1, 1);
  EXPECT_EQ(empty.shape(), (shape_t{0, 3}));
}

TEST(SafetensorsFile, MoveKeepsMappingAlive) {
  scratch_dir dir;
  const std::string p = dir.file("w.safetensors");
  write_file(p, build_safetensors({{"w", "F32", {3}, raw_bytes(iota_f32(3, 1.0f))}}));
  auto a = safetensors_file::open(p);
  safetensors_file b = std::move(a);
  EXPECT_EQ(b.load_f32("w", shape_t{3}).as<float>()[2], 3.0f);
  auto c = safetensors_file::open(p);
  c = std::move(b);
  EXPECT_EQ(c.path(), p);
}

// ---- checkpoint directories -------------------------------------------------------------------

TEST(Checkpoint, ShardedDirectoryWithIndex) {
  scratch_dir dir;
  write_file(dir.file("model-00001-of-00002.safetensors"),
             build_safetensors({{"a", "F32", {2}, raw_bytes(iota_f32(2))}}));
  write_file(dir.file("model-00002-of-00002.safetensors"),
             build_safetensors({{"b", "F32", {3}, raw_bytes(iota_f32(3, 10.0f))}}));
  write_file(dir.file("stray.safetensors"), build_safetensors({{"a", "F32", {1}, raw_bytes(iota_f32(1))}}));
  write_file(dir.file("model.safetensors.index.json"),
             R"({"metadata":{"total_size":20},"weight_map":{"a":"model-00001-of-00002.safetensors",)"
             R"("b":"model-00002-of-00002.safetensors"}})");
  const auto ck = checkpoint::open_dir(dir.str());  // the stray file is not in the index
  EXPECT_TRUE(ck.contains("a"));
  EXPECT_TRUE(ck.contains("b"));
  EXPECT_EQ(ck.load_f32("b", shape_t{3}).as<float>()[2], 12.0f);
  EXPECT_EQ(ck.file_of("a").path(), dir.file("model-00001-of-00002.safetensors"));
}

TEST(Checkpoint, IndexMustMatchFiles) {
  scratch_dir dir;
  write_file(dir.file("one.safetensors"), build_safetensors({{"a", "F32", {2}, raw_bytes(iota_f32(2))}}));
  write_file(dir.file("model.safetensors.index.json"), R"({"weight_map":{"b":"one.safetensors"}})");
  EXPECT_ERROR_WITH((void)checkpoint::open_dir(dir.str()), format_error, "model.safetensors.index.json", "tensor b",
                    "one.safetensors");
  write_file(dir.file("model.safetensors.index.json"), R"({"weight_map":{"a":"missing.safetensors"}})");
  EXPECT_ERROR_WITH((void)checkpoint::open_dir(dir.str()), format_error, "missing.safetensors", "cannot open");
  write_file(dir.file("model.safetensors.index.json"), R"({"metadata":{}})");
  EXPECT_ERROR_WITH((void)checkpoint::open_dir(dir.str()), format_error, "model.safetensors.index.json", "weight_map");
}

TEST(Checkpoint, UnindexedShardsAreAllOpened) {
  scratch_dir dir;
  write_file(dir.file("b.safetensors"), build_safetensors({{"y", "F32", {1}, raw_bytes(iota_f32(1, 5.0f))}}));
  write_file(dir.file("a.safetensors"), build_safetensors({{"x", "F32", {1}, raw_bytes(iota_f32(1, 4.0f))}}));
  write_file(dir.file("notes.txt"), "not a tensor file");
  const auto ck = checkpoint::open_dir(dir.str());
  EXPECT_EQ(ck.load_f32("x", shape_t{1}).as<float>()[0], 4.0f);
  EXPECT_EQ(ck.load_f32("y", shape_t{1}).as<float>()[0], 5.0f);
}

TEST(Checkpoint, TensorInTwoFilesIsAnError) {
  scratch_dir dir;
  write_file(dir.file("a.safetensors"), build_safetensors({{"x", "F32", {1}, raw_bytes(iota_f32(1))}}));
  write_file(dir.file("b.safetensors"), build_safetensors({{"x", "F32", {1}, raw_bytes(iota_f32(1))}}));
  EXPECT_ERROR_WITH((void)checkpoint::open_dir(dir.str()), format_error, "tensor x", "a.safetensors", "b.safetensors");
}

TEST(Checkpoint, EmptyOrMissingDirectory) {
  scratch_dir dir;
  EXPECT_ERROR_WITH((void)checkpoint::open_dir(dir.str()), format_error, dir.str(), "no *.safetensors files");
  EXPECT_ERROR_WITH((void)checkpoint::open_dir(dir.file("absent")), format_error, dir.file("absent"),
                    "not a directory");
}

TEST(Checkpoint, BrokenShardNamesItsFile) {
  scratch_dir dir;
  write_file(dir.file("model.safetensors"), "short");
  EXPECT_ERROR_WITH((void)checkpoint::open_dir(dir.str()), format_error, dir.file("model.safetensors"), "too small");
}

}  // namespace
}  // namespace hyserve
