// Seeded corruption of GGUF files, shared by the unit-test fuzz case (tests/test_gguf.cc) and
// the sanitizer fuzz program (tests/sanitize/gguf_fuzz.cc). Header-only and free of gtest so the
// sanitizer build can use it; the random source and make_tensor are safetensors_fuzzing.h's.
#pragma once
#include <algorithm>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "safetensors_fuzzing.h"

namespace kiln::test {

// Seeded bytes for a tensor of a block type (any bytes are a valid block).
inline Tensor block_tensor(const Shape& shape, DType dtype, uint64_t seed) {
  SplitMix64 rng{seed};
  std::vector<uint8_t> bytes(storage_bytes(dtype, numel(shape)));
  for (uint8_t& b : bytes) b = uint8_t(rng.next());
  return make_tensor<uint8_t>(shape, dtype, bytes);
}

// A valid file to mutate: metadata with strings and nested arrays, scalar tensors (f32, bf16,
// i64) and two block types. Returns its bytes.
inline std::string valid_gguf_file(const fs::path& path) {
  using io::GgufArray;
  using io::GgufType;
  using io::GgufValue;
  std::vector<float> f(12);
  for (size_t i = 0; i < f.size(); ++i) f[i] = float(i) * 0.5f - 3.0f;
  std::vector<uint16_t> bf(4);
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = f32_to_bf16(f[i]);
  const GgufArray tokens{GgufType::string, {GgufValue{std::string("ab")}, GgufValue{std::string("c")}}};
  const GgufArray inner{GgufType::f32, {GgufValue{1.0f}}};
  io::write_gguf(path,
                 {{"general.architecture", GgufValue{std::string("flux")}},
                  {"t.u32", GgufValue{uint32_t(7)}},
                  {"t.tokens", GgufValue{tokens}},
                  {"t.nested", GgufValue{GgufArray{GgufType::array, {GgufValue{inner}}}}}},
                 {{"w", make_tensor<float>({3, 4}, DType::f32, f)},
                  {"b", make_tensor<uint16_t>({4}, DType::bf16, bf)},
                  {"q", block_tensor({2, 32}, DType::q8_0, 5)},
                  {"k", block_tensor({1, 256}, DType::q4_k, 6)},
                  {"i", make_tensor<int64_t>({2, 1}, DType::i64, {1, 2})}});
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// One corruption, mostly of the first `header_len` bytes (everything before the data section),
// where lengths, counts, types, dims and offsets live.
inline void mutate_gguf(std::string& b, uint64_t header_len, SplitMix64& rng) {
  const uint64_t head = std::min<uint64_t>(header_len, b.size());
  if (head == 0) return;
  static const uint64_t kInteresting[] = {0, 1, 2, 3, 4, 7, 8, 9, 12, 13, 31, 32, 33, 64, 255, 0xffffffffull,
                                          0x7fffffffffffffffull, 0x8000000000000000ull, ~0ull};
  switch (rng.below(6)) {
    case 0:  // flip bits in the header
      for (uint64_t k = 1 + rng.below(4); k > 0; --k) b[size_t(rng.below(head))] ^= char(1 + rng.below(255));
      break;
    case 1: {  // an interesting u64 (a length, a count, a dim, an offset)
      const uint64_t at = rng.below(head), v = rng.below(2) ? kInteresting[rng.below(std::size(kInteresting))]
                                                            : uint64_t(b.size()) + rng.below(64) - 32;
      for (size_t i = 0; i < 8 && at + i < b.size(); ++i) b[size_t(at + i)] = char(v >> (8 * i));
      break;
    }
    case 2: {  // an interesting u32 (a type id, n_dims, a version)
      const uint64_t at = rng.below(head), v = rng.below(48);
      for (size_t i = 0; i < 4 && at + i < b.size(); ++i) b[size_t(at + i)] = char(v >> (8 * i));
      break;
    }
    case 3:  // truncation
      b.resize(size_t(rng.below(b.size() + 1)));
      break;
    case 4:  // a byte inserted or removed in the header, shifting everything after it
      if (rng.below(2))
        b.insert(b.begin() + std::ptrdiff_t(rng.below(head)), char(rng.next()));
      else
        b.erase(b.begin() + std::ptrdiff_t(rng.below(head)));
      break;
    default:  // anything anywhere (data bytes too: any block bytes must dequantize)
      for (uint64_t k = 1 + rng.below(8); k > 0; --k) b[size_t(rng.below(b.size()))] = char(rng.next());
  }
}

// Opens the file and loads every tensor every way (whole, converted, row and column slices);
// only kiln::Error may escape.
inline void open_and_load_gguf(const fs::path& path) {
  const io::GgufFile file(path);
  for (const std::string& name : file.names()) {
    try {
      const Tensor t = file.load(name);
      volatile unsigned sum = 0;
      const auto* p = static_cast<const unsigned char*>(t.data_ptr());
      for (size_t i = 0; i < t.nbytes(); ++i) sum = sum + p[i];
      file.load(name, DType::f32);
      const io::GgufTensorInfo& info = file.info(name);
      if (info.shape.size() == 2) {
        file.load_slice(name, 0, info.shape[0] / 2, info.shape[0] - info.shape[0] / 2, DType::f32);
        file.load_slice(name, 1, 0, dtype_block_elems(info.dtype), DType::bf16);
      }
    } catch (const Error&) {
      // A slice the tensor's shape does not allow, and the like; the next tensor may still load.
    }
  }
}

struct GgufFuzzResult {
  long opened = 0;    // mutated files that opened (their tensors loaded or were refused)
  long rejected = 0;  // mutated files refused at open with kiln::Error
  std::string failure;  // the first case that threw anything else ("" when none did)
};

// `cases` mutated copies of `valid` (one or two mutations each, from `rng`), each written to
// `path` and read by open_and_load_gguf. Stops at the first exception that is not a kiln::Error.
inline GgufFuzzResult fuzz_gguf(const std::string& valid, uint64_t header_len, const fs::path& path,
                                SplitMix64& rng, long cases) {
  GgufFuzzResult r;
  for (long i = 0; i < cases; ++i) {
    std::string bytes = valid;
    for (uint64_t m = 1 + rng.below(2); m > 0; --m) mutate_gguf(bytes, header_len, rng);
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
    try {
      open_and_load_gguf(path);
      ++r.opened;
    } catch (const Error&) {
      ++r.rejected;
    } catch (const std::exception& e) {
      r.failure = "case " + std::to_string(i) + ": non-kiln exception: " + e.what();
      break;
    }
  }
  return r;
}

}  // namespace kiln::test
