// Quantized storage types (core/quant_blocks.h) against their references, bit for bit: torch's
// float8 conversions, gguf-py's q8_0 / q4_0 quantizers and its dequantization of every block type,
// ggml's own q4_K / q5_K reference quantizers (tests/fixtures/quant_blocks, made by
// tests/fixtures/generate/make_quant_blocks.py); round-trip error bounds; bf16 output equal to the
// f32 output rounded; errors.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/quant_blocks.h"

namespace kiln {
namespace {

std::vector<uint8_t> read_bytes(const std::string& name) {
  const auto path = std::filesystem::path(KILN_FIXTURES_DIR) / "quant_blocks" / name;
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::vector<float> read_f32(const std::string& name) {
  const auto bytes = read_bytes(name);
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);  // little-endian, as this machine
  return v;
}

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

// Index of the first element whose bits differ, or -1.
int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (bits(a[i]) != bits(b[i])) return int64_t(i);
  return -1;
}

std::vector<float> dequantized(DType t, const std::vector<uint8_t>& q, int64_t n) {
  std::vector<float> out(size_t(n), 0.0f);
  dequantize_to_f32(t, q.data(), out.data(), n);
  return out;
}

std::vector<uint8_t> quantized(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> out(storage_bytes(t, int64_t(x.size())));
  quantize_from_f32(t, x.data(), out.data(), int64_t(x.size()));
  return out;
}

float half_at(const uint8_t* p) { return f16_to_f32(uint16_t(p[0] | p[1] << 8)); }

constexpr DType kAllTypes[] = {DType::f8_e4m3, DType::f8_e5m2, DType::q8_0, DType::q4_0, DType::q4_k, DType::q5_k};

// ---- fp8 against torch ----

TEST(QuantBlocksFp8, DecodesEveryCodeAsTorch) {
  for (auto [t, name] : {std::pair{DType::f8_e4m3, "f8_e4m3"}, std::pair{DType::f8_e5m2, "f8_e5m2"}}) {
    const auto want = read_f32(std::string(name) + "_codes.f32");
    ASSERT_EQ(want.size(), 256u);
    std::vector<uint8_t> codes(256);
    for (int c = 0; c < 256; ++c) codes[size_t(c)] = uint8_t(c);
    const auto got = dequantized(t, codes, 256);
    for (int c = 0; c < 256; ++c) {
      const float one = t == DType::f8_e4m3 ? f8_e4m3_to_f32(uint8_t(c)) : f8_e5m2_to_f32(uint8_t(c));
      EXPECT_EQ(bits(one), bits(want[size_t(c)])) << name << " code " << c;
      EXPECT_EQ(bits(got[size_t(c)]), bits(want[size_t(c)])) << name << " code " << c;
    }
  }
}

TEST(QuantBlocksFp8, EncodesAsTorch) {
  // Every fp8 value, the ties between neighbours and one f32 ulp either side, out-of-range values,
  // f32 subnormals, infinities and NaNs (torch saturates e4m3fn, overflows e5m2 to inf).
  const auto values = read_f32("fp8_values.f32");
  ASSERT_GT(values.size(), 2000u);
  for (auto [t, name] : {std::pair{DType::f8_e4m3, "f8_e4m3"}, std::pair{DType::f8_e5m2, "f8_e5m2"}}) {
    const auto want = read_bytes(std::string(name) + "_from_values.bin");
    ASSERT_EQ(want.size(), values.size());
    const auto got = quantized(t, values);
    int64_t mismatches = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      const uint8_t one = t == DType::f8_e4m3 ? f32_to_f8_e4m3(values[i]) : f32_to_f8_e5m2(values[i]);
      mismatches += one != want[i] || got[i] != want[i];
      if (one != want[i])
        ADD_FAILURE() << name << " of " << values[i] << " (bits 0x" << std::hex << bits(values[i]) << "): got 0x"
                      << int(one) << ", torch 0x" << int(want[i]) << std::dec;
    }
    EXPECT_EQ(mismatches, 0) << name;
  }
  // The documented edge cases, spelled out.
  EXPECT_EQ(f32_to_f8_e4m3(464.0f), 0x7e);  // the tie with 480 (NaN's code) saturates to 448
  EXPECT_EQ(f32_to_f8_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(f32_to_f8_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(f32_to_f8_e5m2(61440.0f), 0x7c);  // the tie above 57344 rounds to even: inf
  EXPECT_EQ(f32_to_f8_e5m2(61439.0f), 0x7b);
  EXPECT_EQ(f32_to_f8_e4m3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: ties to even 0
  EXPECT_EQ(f32_to_f8_e4m3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 subnormal units: ties to even 2
}

TEST(QuantBlocksFp8, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const auto v = uint8_t(c);
    if (!std::isnan(f8_e4m3_to_f32(v))) {
      EXPECT_EQ(f32_to_f8_e4m3(f8_e4m3_to_f32(v)), v) << c;
    }
    if (!std::isnan(f8_e5m2_to_f32(v))) {
      EXPECT_EQ(f32_to_f8_e5m2(f8_e5m2_to_f32(v)), v) << c;
    }
  }
}

// ---- block types against gguf-py and ggml ----

// <type>.bin as gguf-py dequantizes it (q8_0 / q4_0: blocks gguf-py quantized; q4_k / q5_k:
// random blocks with finite scales).
TEST(QuantBlocksGguf, DequantizesAsGgufPy) {
  for (auto [t, name] : {std::pair{DType::q8_0, "q8_0"}, std::pair{DType::q4_0, "q4_0"}, std::pair{DType::q4_k, "q4_k"},
                         std::pair{DType::q5_k, "q5_k"}}) {
    const auto q = read_bytes(std::string(name) + ".bin");
    const auto want = read_f32(std::string(name) + "_dequantized.f32");
    ASSERT_EQ(storage_bytes(t, int64_t(want.size())), q.size()) << name;
    const auto got = dequantized(t, q, int64_t(want.size()));
    const int64_t at = first_bit_difference(got, want);
    EXPECT_EQ(at, -1) << name << " element " << at << ": " << got[size_t(std::max<int64_t>(at, 0))]
                      << " vs gguf-py " << want[size_t(std::max<int64_t>(at, 0))];
  }
}

// gguf-py's Q8_0 / Q4_0 quantizers are ggml's reference ones (quantize_row_q8_0_ref: round half
// away from zero; quantize_row_q4_0_ref: the largest magnitude maps to -8, truncation of x*id+8.5).
TEST(QuantBlocksGguf, Q8_0AndQ4_0QuantizeAsGgufPy) {
  for (auto [t, name] : {std::pair{DType::q8_0, "q8_0"}, std::pair{DType::q4_0, "q4_0"}}) {
    const auto x = read_f32(std::string(name) + "_values.f32");
    const auto want = read_bytes(std::string(name) + ".bin");
    const auto got = quantized(t, x);
    ASSERT_EQ(got.size(), want.size()) << name;
    const size_t block_bytes = dtype_block_bytes(t);
    for (size_t b = 0; b < got.size() / block_bytes; ++b)
      EXPECT_TRUE(std::equal(got.begin() + long(b * block_bytes), got.begin() + long((b + 1) * block_bytes),
                             want.begin() + long(b * block_bytes)))
          << name << " block " << b << " differs from gguf-py's";
  }
}

// gguf-py cannot quantize q4_K / q5_K: the reference is ggml's C (quantize_row_q4_K_ref /
// quantize_row_q5_K_ref, built without FMA contraction, as the C source rounds).
TEST(QuantBlocksGguf, KQuantsQuantizeAsGgmlReference) {
  for (auto [t, name] : {std::pair{DType::q4_k, "q4_k"}, std::pair{DType::q5_k, "q5_k"}}) {
    const auto x = read_f32(std::string(name) + "_values.f32");
    const auto want = read_bytes(std::string(name) + "_ggml.bin");
    const auto got = quantized(t, x);
    ASSERT_EQ(got.size(), want.size()) << name;
    const size_t block_bytes = dtype_block_bytes(t);
    for (size_t b = 0; b < got.size() / block_bytes; ++b)
      EXPECT_TRUE(std::equal(got.begin() + long(b * block_bytes), got.begin() + long((b + 1) * block_bytes),
                             want.begin() + long(b * block_bytes)))
          << name << " block " << b << " differs from ggml's";
  }
}

// The block decoders read f16 scales with their own inline conversion: every f16 value as a q8_0
// scale times 1 must decode as kiln::f16_to_f32 (subnormals, infinities, NaN payloads included).
TEST(QuantBlocksScales, EveryF16ScaleDecodesAsF16ToF32) {
  std::vector<uint8_t> blocks(65536 * 34, 0);
  for (uint32_t h = 0; h < 65536; ++h) {
    uint8_t* b = blocks.data() + size_t(h) * 34;
    b[0] = uint8_t(h & 0xff);
    b[1] = uint8_t(h >> 8);
    b[2] = 1;  // q = 1
  }
  const auto got = dequantized(DType::q8_0, blocks, 65536 * 32);
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = f16_to_f32(uint16_t(h));
    const float one = got[size_t(h) * 32];
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(one)) << h;
    } else {
      ASSERT_EQ(bits(one), bits(want)) << "f16 bits " << h;
    }
    const float zero = got[size_t(h) * 32 + 1];  // q = 0: +-0, or NaN for an infinite or NaN scale
    if (std::isfinite(want)) {
      ASSERT_EQ(bits(zero), bits(0.0f * want)) << "f16 bits " << h;
    } else {
      EXPECT_TRUE(std::isnan(zero)) << h;
    }
  }
}

// ---- round trips ----

std::vector<float> normal_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(size_t(n), 0.0f);
  for (float& x : v) x = dist(rng);
  return v;
}

double rms_relative_error(const std::vector<float>& x, const std::vector<float>& y) {
  double e2 = 0, x2 = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e2 += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    x2 += double(x[i]) * x[i];
  }
  return std::sqrt(e2 / x2);
}

// Measured RMS relative errors on N(0, 1) data (65536 values): f8_e4m3 0.0265, f8_e5m2 0.0529,
// q8_0 0.0053, q4_0 0.086, q4_k 0.071, q5_k 0.036; the bounds leave about 10% headroom.
TEST(QuantBlocksRoundTrip, ErrorsWithinEachTypesBound) {
  const int64_t n = 65536;
  const auto x = normal_values(n, 19);
  const struct {
    DType t;
    double rms_bound;
  } cases[] = {{DType::f8_e4m3, 0.029}, {DType::f8_e5m2, 0.058}, {DType::q8_0, 0.0059},
               {DType::q4_0, 0.095},    {DType::q4_k, 0.078},    {DType::q5_k, 0.04}};
  for (const auto& c : cases) {
    const auto q = quantized(c.t, x);
    const auto y = dequantized(c.t, q, n);
    const double rms = rms_relative_error(x, y);
    EXPECT_LE(rms, c.rms_bound) << dtype_name(c.t);
    RecordProperty(std::string(dtype_name(c.t)) + "_rms_relative_error", std::to_string(rms));
    // Per-element bounds.
    const int64_t block = std::max<int64_t>(dtype_block_elems(c.t), 32);
    for (int64_t b = 0; b < n / block; ++b) {
      const float* xb = x.data() + b * block;
      const float* yb = y.data() + b * block;
      const uint8_t* qb = q.data() + storage_bytes(c.t, b * block);
      for (int64_t i = 0; i < block; ++i) {
        const double err = std::fabs(double(yb[i]) - xb[i]);
        double bound = 0;
        switch (c.t) {
          // half a unit in the last place: 2^-(mantissa bits + 1) relative, or half the smallest subnormal
          case DType::f8_e4m3: bound = std::max(std::ldexp(std::fabs(double(xb[i])), -4), std::ldexp(1.0, -10)); break;
          case DType::f8_e5m2: bound = std::max(std::ldexp(std::fabs(double(xb[i])), -3), std::ldexp(1.0, -17)); break;
          // half a step of the f32 scale amax/127, plus up to 127 times the scale's f16 rounding (2^-11 relative)
          case DType::q8_0: bound = double(half_at(qb)) * (0.5 + 127.0 / 2048) * (1 + 1.0 / 1024); break;
          // the largest magnitude maps to -8, so +amax clamps to 7: up to one step, plus f16 rounding
          case DType::q4_0: bound = std::fabs(double(half_at(qb))) * (1 + 16.0 / 2048); break;
          // the fit may clamp levels at either end: a step and a half of the sub-block's range / nmax
          case DType::q4_k:
          case DType::q5_k: {
            const float* xs = xb + i / 32 * 32;
            float lo = 0, hi = xs[0];
            for (int l = 0; l < 32; ++l) lo = std::min(lo, xs[l]), hi = std::max(hi, xs[l]);
            bound = (double(hi) - lo) * 1.5 / (c.t == DType::q4_k ? 15 : 31);
            break;
          }
          default: break;
        }
        ASSERT_LE(err, bound) << dtype_name(c.t) << " element " << b * block + i << " (" << xb[i] << " -> " << yb[i]
                              << ")";
      }
    }
  }
}

// An all-zero input (every scale zero) decodes as zeros.
TEST(QuantBlocksRoundTrip, ZerosStayZero) {
  const std::vector<float> zeros(512, 0.0f);
  for (DType t : kAllTypes) {
    const auto y = dequantized(t, quantized(t, zeros), 512);
    for (float v : y) ASSERT_EQ(v, 0.0f) << dtype_name(t);
  }
}

// ---- bf16 output ----

// dequantize_to_bf16 is dequantize_to_f32 rounded by kiln::f32_to_bf16, for random bytes of every
// type (scales of any f16 value, NaN and inf included) and a run of blocks that is not a multiple
// of any vector length.
TEST(QuantBlocksBf16, EqualsRoundedF32ForEveryType) {
  std::mt19937 rng(7);
  for (DType t : kAllTypes) {
    const int64_t n = dtype_block_elems(t) * 37;
    std::vector<uint8_t> q(storage_bytes(t, n));
    for (auto& b : q) b = uint8_t(rng());
    const auto f = dequantized(t, q, n);
    std::vector<uint16_t> h(size_t(n), 0);
    dequantize_to_bf16(t, q.data(), h.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(h[size_t(i)], f32_to_bf16(f[size_t(i)])) << dtype_name(t) << " element " << i << " = " << f[size_t(i)];
  }
}

// ---- errors ----

TEST(QuantBlocksErrors, CountsThatAreNotWholeBlocks) {
  std::vector<uint8_t> q(4096, 0);
  std::vector<float> f(1024, 0.0f);
  std::vector<uint16_t> h(1024, 0);
  const struct {
    DType t;
    int64_t n;
  } bad[] = {{DType::q8_0, 33}, {DType::q4_0, 16}, {DType::q4_k, 255}, {DType::q5_k, 512 + 32}, {DType::q8_0, -32}};
  for (const auto& c : bad) {
    EXPECT_THROW(dequantize_to_f32(c.t, q.data(), f.data(), c.n), Error) << dtype_name(c.t) << " " << c.n;
    EXPECT_THROW(dequantize_to_bf16(c.t, q.data(), h.data(), c.n), Error) << dtype_name(c.t) << " " << c.n;
    EXPECT_THROW(quantize_from_f32(c.t, f.data(), q.data(), c.n), Error) << dtype_name(c.t) << " " << c.n;
  }
  try {
    dequantize_to_f32(DType::q4_k, q.data(), f.data(), 300);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[dequantize] q4_k: 300 elements are not a whole number of its 256-element"),
              std::string::npos)
        << e.what();
  }
  // Whole blocks, and fp8's one-element blocks, are fine.
  EXPECT_NO_THROW(dequantize_to_f32(DType::q4_k, q.data(), f.data(), 0));
  EXPECT_NO_THROW(dequantize_to_f32(DType::f8_e4m3, q.data(), f.data(), 33));
}

TEST(QuantBlocksErrors, TypesThatAreNotStorageTypes) {
  std::vector<uint8_t> q(256, 0);
  std::vector<float> f(64, 0.0f);
  std::vector<uint16_t> h(64, 0);
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::boolean}) {
    EXPECT_THROW(dequantize_to_f32(t, q.data(), f.data(), 32), Error) << dtype_name(t);
    EXPECT_THROW(dequantize_to_bf16(t, q.data(), h.data(), 32), Error) << dtype_name(t);
    EXPECT_THROW(quantize_from_f32(t, f.data(), q.data(), 32), Error) << dtype_name(t);
  }
}

TEST(QuantBlocksErrors, BlockTypesQuantizeOnlyFiniteValues) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> x(256, 1.0f);
    x[100] = bad;
    for (DType t : {DType::q8_0, DType::q4_0, DType::q4_k, DType::q5_k}) {
      std::vector<uint8_t> q(storage_bytes(t, 256));
      try {
        quantize_from_f32(t, x.data(), q.data(), 256);
        ADD_FAILURE() << dtype_name(t) << " quantized " << bad;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("element 100"), std::string::npos) << e.what();
      }
    }
    // fp8 follows torch: NaN and inf have encodings.
    std::vector<uint8_t> q(256);
    EXPECT_NO_THROW(quantize_from_f32(DType::f8_e4m3, x.data(), q.data(), 256));
  }
}

}  // namespace
}  // namespace kiln
