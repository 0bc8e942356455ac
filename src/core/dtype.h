// Element types and exact conversions between them.
#pragma once
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

namespace kiln {

// f8_e4m3 / f8_e5m2 (torch's float8_e4m3fn / float8_e5m2) and the ggml block types q8_0, q4_0,
// q4_k, q5_k are storage types: weights are held and read in them (linears compute from them
// directly, core/quant_blocks.h), but no op produces them and no activation is computed in them.
enum class DType : uint8_t { f32, bf16, f16, i32, i64, boolean, f8_e4m3, f8_e5m2, q8_0, q4_0, q4_k, q5_k };

// Bytes per element of a scalar type; a block type has none (fails naming it: use storage_bytes).
size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", "bf16", ...
bool is_floating(DType t);        // f32, bf16, f16: the types values are computed in
// The ggml block types: each block of dtype_block_elems(t) consecutive elements of a row is
// stored in dtype_block_bytes(t) bytes (scales and packed integers).
bool is_block_quantized(DType t);
// Types only weights are stored in: fp8 and the block types.
bool is_storage_only(DType t);
int64_t dtype_block_elems(DType t);  // 1 for scalar types
size_t dtype_block_bytes(DType t);   // dtype_size for scalar types
// Bytes of `elems` consecutive elements starting at a block boundary (elems a whole number of
// blocks; fails naming the type otherwise).
size_t storage_bytes(DType t, int64_t elems);
// The dtype named `name` ("f32", "bf16", "q8_0", ...); nullopt when there is none.
std::optional<DType> dtype_from_name(const std::string& name);
// The type both operands of a binary op are computed in / stored as (like torch's promotion).
DType promote(DType a, DType b);

// ---- bit-exact scalar conversions (round to nearest, ties to even) ----
inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Reads element i of a buffer of type t as double / writes a double (rounding as the type requires).
double load_as_double(const void* data, DType t, int64_t i);
void store_from_double(void* data, DType t, int64_t i, double v);

// Bulk conversions (used by kernels to move between storage dtype and f32 compute tiles).
void convert_to_f32(const void* src, DType t, float* dst, int64_t n);
void convert_from_f32(const float* src, void* dst, DType t, int64_t n);

}  // namespace kiln
