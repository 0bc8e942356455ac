// The cpu row decoders (devices/cpu/kernels/dequantize.h) against the scalar reference
// (core/quant_blocks.h), bit for bit, f32 and bf16 output: random bytes of every storage type,
// every f16 value as every block type's scale (d and dmin), the special scales (zeros,
// subnormals, infinities, quiet and signalling NaNs) in every pairing, runs whose length is not a
// multiple of any vector length, and the same errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/quant_blocks.h"
#include "devices/cpu/kernels/dequantize.h"

namespace kiln {
namespace {

constexpr DType kAllTypes[] = {DType::f8_e4m3, DType::f8_e5m2, DType::q8_0, DType::q4_0, DType::q4_k, DType::q5_k};

// Decodes n elements of t at q with the kernels and the reference, f32 and bf16, and asserts every
// element's bits are equal. Returns how many of the values are NaN (so a test can check that it
// reached the NaN cases it is about).
int64_t expect_kernels_equal_reference(DType t, const uint8_t* q, int64_t n, const char* what) {
  std::vector<float> want_f(size_t(n), 1.0f), got_f(size_t(n), 2.0f);
  std::vector<uint16_t> want_h(size_t(n), 1), got_h(size_t(n), 2);
  dequantize_to_f32(t, q, want_f.data(), n);
  dequantize_to_bf16(t, q, want_h.data(), n);
  cpu::dequantize_row_f32(t, q, got_f.data(), n);
  cpu::dequantize_row_bf16(t, q, got_h.data(), n);
  int64_t nan_values = 0, mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto k = size_t(i);
    nan_values += want_f[k] != want_f[k];
    const bool same = std::bit_cast<uint32_t>(got_f[k]) == std::bit_cast<uint32_t>(want_f[k]) && got_h[k] == want_h[k];
    if (!same && mismatches++ == 0)
      ADD_FAILURE() << what << " " << dtype_name(t) << " element " << i << ": f32 bits 0x" << std::hex
                    << std::bit_cast<uint32_t>(got_f[k]) << " vs reference 0x" << std::bit_cast<uint32_t>(want_f[k])
                    << ", bf16 0x" << got_h[k] << " vs reference 0x" << want_h[k] << std::dec;
  }
  EXPECT_EQ(mismatches, 0) << what << " " << dtype_name(t) << " (" << n << " elements)";
  return nan_values;
}

int64_t expect_kernels_equal_reference(DType t, const std::vector<uint8_t>& q, int64_t n, const char* what) {
  EXPECT_EQ(storage_bytes(t, n), q.size()) << what;
  return expect_kernels_equal_reference(t, q.data(), n, what);
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> q(n);
  for (auto& b : q) b = uint8_t(rng());
  return q;
}

void put_half(uint8_t* p, uint16_t h) {
  p[0] = uint8_t(h & 0xff);
  p[1] = uint8_t(h >> 8);
}

// Random bytes: scales of any f16 value (about 1 in 32 a NaN or inf), runs of 1, 37 and 301
// blocks; fp8 runs of every length up to 40 (every tail past the vectors) and a few thousand.
TEST(DequantizeKernels, EqualReferenceOnRandomBytes) {
  uint32_t seed = 1;
  for (DType t : kAllTypes) {
    int64_t nan_values = 0;
    for (int64_t blocks : {1, 37, 301}) {
      const int64_t n = std::max<int64_t>(dtype_block_elems(t), 10) * blocks;  // fp8: 10 to 3010 elements
      nan_values += expect_kernels_equal_reference(t, random_bytes(storage_bytes(t, n), seed++), n, "random");
    }
    EXPECT_GT(nan_values, 0) << dtype_name(t);
  }
  for (DType t : {DType::f8_e4m3, DType::f8_e5m2})
    for (int64_t n = 0; n < 40; ++n)
      expect_kernels_equal_reference(t, random_bytes(size_t(n), seed++), n, "fp8_tail");
}

// Every f16 value as each block type's d (and, for the k-quants, every f16 value as dmin, paired
// with d by an odd multiplier so that every d and every dmin occurs), the other bytes random.
TEST(DequantizeKernels, EqualReferenceForEveryF16Scale) {
  for (DType t : {DType::q8_0, DType::q4_0, DType::q4_k, DType::q5_k}) {
    const int64_t blocks = 65536, n = dtype_block_elems(t) * blocks;
    auto q = random_bytes(storage_bytes(t, n), 100 + uint32_t(t));
    const size_t block_bytes = dtype_block_bytes(t);
    for (uint32_t h = 0; h < 65536; ++h) {
      uint8_t* b = q.data() + size_t(h) * block_bytes;
      put_half(b, uint16_t(h));
      if (t == DType::q4_k || t == DType::q5_k) put_half(b + 2, uint16_t(h * 40503u));
    }
    // In runs of 4096 blocks, to keep the decoded copies small.
    int64_t nan_values = 0;
    for (int64_t b = 0; b < blocks; b += 4096)
      nan_values += expect_kernels_equal_reference(t, q.data() + size_t(b) * block_bytes,
                                                   4096 * dtype_block_elems(t), "every_f16_scale");
    EXPECT_GT(nan_values, 0) << dtype_name(t);
  }
}

// The special scales in every (d, dmin) pairing, with quants that include zeros (inf * 0 is NaN)
// and sub-block scales and mins that include zero: where a NaN comes from and which of two NaNs
// survives must match the reference.
TEST(DequantizeKernels, EqualReferenceForSpecialScalePairs) {
  const uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x83ff, 0x3c00, 0xfbff, 0x7c00, 0xfc00,
                               0x7e00, 0xfe00, 0x7e5a, 0x7c01, 0xfd55, 0x7fff};
  for (DType t : {DType::q8_0, DType::q4_0, DType::q4_k, DType::q5_k}) {
    const bool k_quant = t == DType::q4_k || t == DType::q5_k;
    const size_t block_bytes = dtype_block_bytes(t);
    std::vector<uint8_t> q;
    uint32_t seed = 200;
    for (uint16_t d : specials) {
      for (uint16_t dmin : specials) {
        if (!k_quant && dmin != specials[0]) continue;
        // Three variants: random bytes, all-zero quants / scales, every other byte zero.
        for (int variant = 0; variant < 3; ++variant) {
          auto b = random_bytes(block_bytes, seed++);
          for (size_t i = 2; i < block_bytes; ++i)
            if (variant == 1 || (variant == 2 && i % 2 == 0)) b[i] = 0;
          if (t == DType::q4_0 && variant != 0) std::memset(b.data() + 2, 0x88, 16);  // q - 8 == 0
          put_half(b.data(), d);
          if (k_quant) put_half(b.data() + 2, dmin);
          q.insert(q.end(), b.begin(), b.end());
        }
      }
    }
    const int64_t n = int64_t(q.size() / block_bytes) * dtype_block_elems(t);
    EXPECT_GT(expect_kernels_equal_reference(t, q, n, "special_scales"), 0) << dtype_name(t);
  }
}

// Every fp8 code, forwards and backwards, at every offset a vector might start.
TEST(DequantizeKernels, EqualReferenceForEveryFp8Code) {
  std::vector<uint8_t> q(512 + 15);
  for (size_t i = 0; i < q.size(); ++i) q[i] = uint8_t(i < 256 ? i : i < 512 ? 511 - i : i * 37);
  for (DType t : {DType::f8_e4m3, DType::f8_e5m2})
    for (int64_t offset = 0; offset < 16; ++offset) {
      std::vector<uint8_t> run(q.begin() + offset, q.begin() + offset + 512);
      expect_kernels_equal_reference(t, run, 512, "every_code");
    }
}

// The kernels refuse what the reference refuses, with its message.
TEST(DequantizeKernels, SameErrorsAsReference) {
  std::vector<uint8_t> q(4096, 0);
  std::vector<float> f(1024, 0.0f);
  std::vector<uint16_t> h(1024, 0);
  const struct {
    DType t;
    int64_t n;
  } bad[] = {{DType::q8_0, 33}, {DType::q4_0, 16}, {DType::q4_k, 255}, {DType::q5_k, 512 + 32}, {DType::q8_0, -32},
             {DType::f32, 32},  {DType::bf16, 32}, {DType::i32, 32}};
  for (const auto& c : bad) {
    EXPECT_THROW(cpu::dequantize_row_f32(c.t, q.data(), f.data(), c.n), Error) << dtype_name(c.t) << " " << c.n;
    EXPECT_THROW(cpu::dequantize_row_bf16(c.t, q.data(), h.data(), c.n), Error) << dtype_name(c.t) << " " << c.n;
  }
  try {
    cpu::dequantize_row_bf16(DType::q4_k, q.data(), h.data(), 300);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[dequantize] q4_k: 300 elements are not a whole number of its 256-element"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(cpu::dequantize_row_f32(DType::q4_k, q.data(), f.data(), 0));
}

}  // namespace
}  // namespace kiln
