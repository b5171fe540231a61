// Wire decoders on hostile bytes (wire_test_support.h, fuzz_one): random bytes, random payloads
// under a valid header, mutated valid messages resealed, counts written at every offset, and
// fuzzed step plan extensions: each decodes (and re-encodes to the same bytes) or throws
// wire_error, allocating no more than the input can describe.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "wire_test_support.h"

namespace hyserve::wire {
namespace {

// ---- fuzz -----------------------------------------------------------------------------------

TEST(WireFuzz, RandomBytes) {
  std::mt19937 rng(20240601);
  fuzz_counts counts;
  for (int iter = 0; iter < 3000; ++iter) {
    bytes_t b(rng() % 513);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    fuzz_all_decoders(b, counts);
  }
  EXPECT_EQ(counts.decoded, 0);
}

TEST(WireFuzz, RandomPayloadsWithValidHeader) {
  std::mt19937 rng(7);
  fuzz_counts counts;
  for (int iter = 0; iter < 3000; ++iter) {
    bytes_t b(kHeaderBytes + rng() % 497);
    for (auto& x : b) x = static_cast<uint8_t>(rng() % 4 == 0 ? 0 : rng());
    set_u32(b, 0, kMagic);
    set_u16(b, 4, kVersion);
    set_u16(b, 6, static_cast<uint16_t>(1 + rng() % 4));
    reseal(b);
    fuzz_all_decoders(b, counts);
  }
  EXPECT_GT(counts.rejected, 0);
}

TEST(WireFuzz, MutatedValidMessagesWithResealedChecksum) {
  const std::vector<bytes_t> seeds = {encode(sample_plan()), encode(sample_result()), encode(sample_hello()),
                                      encode_shutdown(), encode(step_plan{}), encode(step_result{})};
  constexpr uint32_t kInteresting[] = {0, 1, 2, 0x7f, 0xff, 0x7fffffff, 0x80000000, 0xffffffff, 0xfffffffe,
                                       kMaxRows, kMaxRows + 1, kMaxTokensPerRow, kMaxStringBytes, 3, 70};
  std::mt19937 rng(1234);
  fuzz_counts counts;
  for (int iter = 0; iter < 6000; ++iter) {
    bytes_t b = seeds[rng() % seeds.size()];
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < mutations; ++k) {
      const size_t payload = b.size() - kHeaderBytes;
      const size_t at = kHeaderBytes + (payload == 0 ? 0 : rng() % payload);
      switch (rng() % 5) {
        case 0:  // random byte
          if (payload > 0) b[at] = static_cast<uint8_t>(rng());
          break;
        case 1:  // interesting u32 (counts, lengths, slots)
          if (payload >= 4) set_u32(b, kHeaderBytes + rng() % (payload - 3), kInteresting[rng() % std::size(kInteresting)]);
          break;
        case 2:  // insert bytes
          b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), 1 + rng() % 8, static_cast<uint8_t>(rng()));
          break;
        case 3:  // erase bytes
          if (payload > 0) b.erase(b.begin() + static_cast<std::ptrdiff_t>(at), b.begin() + static_cast<std::ptrdiff_t>(std::min(b.size(), at + 1 + rng() % 8)));
          break;
        case 4:  // truncate the payload
          b.resize(at);
          break;
      }
    }
    reseal(b);
    fuzz_all_decoders(b, counts);
  }
  // Both paths are exercised: some mutations keep a valid message, most do not.
  EXPECT_GT(counts.decoded, 100);
  EXPECT_GT(counts.rejected, 1000);
}

TEST(WireFuzz, EveryPayloadOffsetOverwrittenWithCounts) {
  // Lands plausible and hostile counts on every count field (and everything else) of each
  // message, so an allocation sized from a count before checking it against the bytes left
  // shows up in the allocation bound.
  const std::vector<bytes_t> seeds = {encode(sample_plan()), encode(sample_result()), encode(sample_hello())};
  constexpr uint32_t kCounts[] = {2, 3, 5, 9, 17, 33, 65, 129, 257, 1025, 65537, kMaxRows, kMaxTokensPerRow, 0xffffffff};
  fuzz_counts counts;
  for (const bytes_t& seed : seeds) {
    for (size_t at = kHeaderBytes; at + 4 <= seed.size(); ++at) {
      for (uint32_t c : kCounts) {
        bytes_t b = seed;
        set_u32(b, at, c);
        reseal(b);
        fuzz_all_decoders(b, counts);
      }
    }
  }
  EXPECT_GT(counts.rejected, 0);
}

TEST(WireSpecExtension, FuzzedExtensionsDecodeOrRejectCleanly) {
  std::mt19937 rng(99);
  const bytes_t good = encode(spec_plan());
  const size_t base = encode(sample_plan()).size();
  fuzz_counts counts;
  for (int iter = 0; iter < 2000; ++iter) {
    bytes_t b = good;
    b.resize(base + rng() % (good.size() - base + 8));
    for (size_t i = base; i < b.size(); ++i)
      if (rng() % 3 == 0) b[i] = static_cast<uint8_t>(rng() % 4 == 0 ? rng() : rng() % 3);
    reseal(b);
    fuzz_all_decoders(b, counts);
  }
  EXPECT_GT(counts.rejected, 0);
  EXPECT_GT(counts.decoded, 0);
}

}  // namespace
}  // namespace hyserve::wire
