// Seeded corruption of safetensors files, shared by the unit-test fuzz case
// (tests/test_safetensors.cc) and the sanitizer fuzz program (tests/sanitize/).
// Header-only and free of gtest so the sanitizer build can use it.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"

namespace kiln::test {

namespace fs = std::filesystem;

// Deterministic across platforms (unlike std:: distributions), so failures reproduce.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }
};

inline std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char((v >> (8 * i)) & 0xff);
  return s;
}

inline uint64_t read_le64(const std::string& b) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8 && i < b.size(); ++i) v |= uint64_t(uint8_t(b[i])) << (8 * i);
  return v;
}

template <typename T>
Tensor make_tensor(const kiln::Shape& shape, DType dtype, const std::vector<T>& values) {
  const size_t bytes = values.size() * sizeof(T);
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (bytes) std::memcpy(p, values.data(), bytes);
  auto buf = std::make_shared<kiln::Buffer>(p, bytes, kiln::Device::cpu(), [p] { std::free(p); });
  return Tensor::view_of(buf, shape, dtype);
}

// A valid file with every kiln dtype, a 2-D tensor for slices, an empty tensor and metadata.
inline std::string valid_file(const fs::path& path) {
  std::vector<float> f(12);
  std::vector<uint16_t> bf(4), h(5);
  for (size_t i = 0; i < f.size(); ++i) f[i] = float(i) * 0.5f - 2.0f;
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = kiln::f32_to_bf16(f[i]);
  for (size_t i = 0; i < h.size(); ++i) h[i] = kiln::f32_to_f16(f[i]);
  kiln::io::save_safetensors(path,
                             {{"w", make_tensor<float>({3, 4}, DType::f32, f)},
                              {"b", make_tensor<uint16_t>({2, 2}, DType::bf16, bf)},
                              {"h", make_tensor<uint16_t>({5}, DType::f16, h)},
                              {"i", make_tensor<int32_t>({3}, DType::i32, {1, -2, 3})},
                              {"l", make_tensor<int64_t>({2, 1}, DType::i64, {1, 2})},
                              {"m", make_tensor<uint8_t>({3}, DType::boolean, {1, 0, 1})},
                              {"e", make_tensor<float>({0, 3}, DType::f32, {})}},
                             {{"format", "pt"}});
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void mutate_once(std::string& b, uint64_t header_len, SplitMix64& rng) {
  static const char kJsonish[] = "{}[]\":,-+0123456789eE. \\u\x00\xff";
  const uint64_t editable = b.size() > 8 ? std::min<uint64_t>(header_len, b.size() - 8) : 0;
  switch (rng.below(5)) {
    case 0:  // flip bits in the header
      for (uint64_t k = 1 + rng.below(4); k > 0 && editable > 0; --k)
        b[size_t(8 + rng.below(editable))] ^= char(1 + rng.below(255));
      break;
    case 1:  // JSON-significant characters where they break structure
      for (uint64_t k = 1 + rng.below(3); k > 0 && editable > 0; --k)
        b[size_t(8 + rng.below(editable))] = kJsonish[rng.below(sizeof kJsonish - 1)];
      break;
    case 2:  // truncation
      b.resize(size_t(rng.below(b.size() + 1)));
      break;
    case 3:  // a run of digits, which shifts sizes and offsets
      if (editable > 0) {
        const size_t at = size_t(8 + rng.below(editable));
        b[at] = char('0' + rng.below(10));
        if (at + 1 < 8 + editable) b[at + 1] = char('0' + rng.below(10));
      }
      break;
    default: {  // header length: near the truth, small, or anything
      if (b.size() < 8) b.resize(8, '\0');
      const uint64_t choice = rng.below(3);
      const uint64_t v = choice == 0   ? header_len + rng.below(33) - 16
                         : choice == 1 ? rng.below(b.size() + 64)
                                       : rng.next();
      b.replace(0, 8, le64(v));
    }
  }
}

// Loads every tensor every way; only kiln::Error may escape.
inline void open_and_load_all(const fs::path& path) {
  const kiln::io::SafetensorsFile file(path);
  for (const std::string& name : file.names()) {
    try {
      const Tensor t = file.load(name);
      volatile unsigned sum = 0;
      const auto* p = static_cast<const unsigned char*>(t.data_ptr());
      for (size_t i = 0; i < t.nbytes(); ++i) sum = sum + p[i];
      file.load(name, DType::f32);
      const kiln::io::TensorInfo& info = file.info(name);
      if (info.shape.size() == 2) {
        file.load_slice(name, 0, info.shape[0] / 2, info.shape[0] - info.shape[0] / 2, DType::f32);
        file.load_slice(name, 1, 0, info.shape[1] / 2, DType::bf16);
      }
    } catch (const kiln::Error&) {
      // Unsupported dtypes and the like; the next tensor may still load.
    }
  }
}

}  // namespace kiln::test
