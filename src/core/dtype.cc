#include "core/dtype.h"

#include <cmath>

#include "core/error.h"
#include "core/quant_blocks.h"

namespace kiln {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::boolean: return 1;
    case DType::f8_e4m3:
    case DType::f8_e5m2: return 1;
    case DType::q8_0:
    case DType::q4_0:
    case DType::q4_k:
    case DType::q5_k: break;
  }
  fail("dtype", dtype_name(t), " is a block type: its elements have no size of their own");
}

bool is_block_quantized(DType t) {
  return t == DType::q8_0 || t == DType::q4_0 || t == DType::q4_k || t == DType::q5_k;
}

bool is_storage_only(DType t) { return is_block_quantized(t) || t == DType::f8_e4m3 || t == DType::f8_e5m2; }

int64_t dtype_block_elems(DType t) {
  switch (t) {
    case DType::q8_0:
    case DType::q4_0: return 32;
    case DType::q4_k:
    case DType::q5_k: return 256;
    default: return 1;
  }
}

size_t dtype_block_bytes(DType t) {
  switch (t) {
    case DType::q8_0: return 34;   // f16 scale + 32 int8
    case DType::q4_0: return 18;   // f16 scale + 32 4-bit
    case DType::q4_k: return 144;  // f16 d, dmin + 12 bytes of 6-bit scales/mins + 128 bytes of 4-bit
    case DType::q5_k: return 176;  // q4_k's + 32 bytes of high bits
    default: return dtype_size(t);
  }
}

size_t storage_bytes(DType t, int64_t elems) {
  const int64_t block = dtype_block_elems(t);
  KILN_CHECK(elems >= 0 && elems % block == 0, "dtype", elems, " elements of ", dtype_name(t),
             " are not a whole number of its ", block, "-element blocks");
  return size_t(elems / block) * dtype_block_bytes(t);
}

std::optional<DType> dtype_from_name(const std::string& name) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean, DType::f8_e4m3,
                  DType::f8_e5m2, DType::q8_0, DType::q4_0, DType::q4_k, DType::q5_k})
    if (name == dtype_name(t)) return t;
  return std::nullopt;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
    case DType::f8_e4m3: return "f8_e4m3";
    case DType::f8_e5m2: return "f8_e5m2";
    case DType::q8_0: return "q8_0";
    case DType::q4_0: return "q4_0";
    case DType::q4_k: return "q4_k";
    case DType::q5_k: return "q5_k";
  }
  return "?";
}

bool is_floating(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

DType promote(DType a, DType b) {
  if (a == b) return a;
  const bool fa = is_floating(a), fb = is_floating(b);
  if (fa && fb) return DType::f32;  // bf16 with f16 (or either with f32) meets in f32
  if (fa) return a;
  if (fb) return b;
  if (a == DType::i64 || b == DType::i64) return DType::i64;
  if (a == DType::i32 || b == DType::i32) return DType::i32;
  return DType::boolean;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | uint32_t(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  const uint32_t absbits = bits & 0x7fffffffu;
  if (absbits > 0x7f800000u) return sign | 0x7e00;  // NaN
  if (absbits >= 0x477ff000u) return sign | 0x7c00;  // rounds to >= 65520: inf
  if (absbits < 0x38800000u) {                       // below the smallest normal f16 (2^-14)
    // Subnormal result: value = absf * 2^24 rounded to an integer count of 2^-24 units.
    float absf;
    std::memcpy(&absf, &absbits, 4);
    const float scaled = absf * 16777216.0f;  // exact (power of two)
    const float r = std::nearbyint(scaled);   // default rounding mode: ties to even
    return sign | uint16_t(r);
  }
  // Normal: drop 13 mantissa bits with round-to-nearest-even.
  uint32_t m = absbits + 0xfffu + ((absbits >> 13) & 1u);
  return sign | uint16_t((m - (uint32_t(127 - 15) << 23)) >> 13);
}

double load_as_double(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(data)[i];
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::i32: return static_cast<const int32_t*>(data)[i];
    case DType::i64: return double(static_cast<const int64_t*>(data)[i]);
    case DType::boolean: return static_cast<const uint8_t*>(data)[i] ? 1.0 : 0.0;
    default: {  // a storage type: the element's block, dequantized
      const int64_t block = dtype_block_elems(t);
      float values[256];
      dequantize_to_f32(t, static_cast<const char*>(data) + size_t(i / block) * dtype_block_bytes(t), values, block);
      return values[i % block];
    }
  }
}

void store_from_double(void* data, DType t, int64_t i, double v) {
  switch (t) {
    case DType::f32: static_cast<float*>(data)[i] = float(v); return;
    case DType::bf16: static_cast<uint16_t*>(data)[i] = f32_to_bf16(float(v)); return;
    case DType::f16: static_cast<uint16_t*>(data)[i] = f32_to_f16(float(v)); return;
    case DType::i32: static_cast<int32_t*>(data)[i] = int32_t(v); return;
    case DType::i64: static_cast<int64_t*>(data)[i] = int64_t(v); return;
    case DType::boolean: static_cast<uint8_t*>(data)[i] = v != 0.0; return;
    case DType::f8_e4m3: static_cast<uint8_t*>(data)[i] = f32_to_f8_e4m3(float(v)); return;
    case DType::f8_e5m2: static_cast<uint8_t*>(data)[i] = f32_to_f8_e5m2(float(v)); return;
    default: fail("dtype", "cannot store one element of the block type ", dtype_name(t));
  }
}

// dst[i] = f(src[i]) for n elements of type S at src, written as D at dst: the loop of each of
// convert_to_f32's and convert_from_f32's element types.
namespace {
template <class S, class D = float, class F>
void convert_each(const void* src, void* dst, int64_t n, F f) {
  const auto* s = static_cast<const S*>(src);
  auto* d = static_cast<D*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = f(s[i]);
}
}  // namespace

void convert_to_f32(const void* src, DType t, float* dst, int64_t n) {
  switch (t) {
    case DType::f32: std::memcpy(dst, src, size_t(n) * 4); return;
    case DType::bf16: convert_each<uint16_t>(src, dst, n, [](uint16_t v) { return bf16_to_f32(v); }); return;
    case DType::f16: convert_each<uint16_t>(src, dst, n, [](uint16_t v) { return f16_to_f32(v); }); return;
    case DType::i32: convert_each<int32_t>(src, dst, n, [](int32_t v) { return float(v); }); return;
    case DType::i64: convert_each<int64_t>(src, dst, n, [](int64_t v) { return float(v); }); return;
    case DType::boolean: convert_each<uint8_t>(src, dst, n, [](uint8_t v) { return v ? 1.0f : 0.0f; }); return;
    default: dequantize_to_f32(t, src, dst, n); return;
  }
}

void convert_from_f32(const float* src, void* dst, DType t, int64_t n) {
  switch (t) {
    case DType::f32: std::memcpy(dst, src, size_t(n) * 4); return;
    case DType::bf16: convert_each<float, uint16_t>(src, dst, n, [](float v) { return f32_to_bf16(v); }); return;
    case DType::f16: convert_each<float, uint16_t>(src, dst, n, [](float v) { return f32_to_f16(v); }); return;
    case DType::i32: convert_each<float, int32_t>(src, dst, n, [](float v) { return int32_t(v); }); return;
    case DType::i64: convert_each<float, int64_t>(src, dst, n, [](float v) { return int64_t(v); }); return;
    case DType::boolean: convert_each<float, uint8_t>(src, dst, n, [](float v) { return v != 0.0f; }); return;
    default: quantize_from_f32(t, src, dst, n); return;
  }
}

}  // namespace kiln
