#include "tokenizers/precompiled_charsmap.h"

#include "core/error.h"
#include "tokenizers/grapheme_clusters.h"
#include "tokenizers/unicode_text.h"

namespace kiln::tokenizers {
namespace {

// darts-clone's double-array unit layout (spm_precompiled's ArrayUnitTrait).
bool has_leaf(uint32_t u) { return ((u >> 8) & 1) == 1; }
uint32_t value(uint32_t u) { return u & ((1u << 31) - 1); }
uint32_t label(uint32_t u) { return u & ((1u << 31) | 0xFF); }
uint64_t offset(uint32_t u) { return uint64_t(u >> 10) << ((u & (1u << 9)) >> 6); }

size_t utf8_length(unsigned char lead) { return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

}  // namespace

std::string PrecompiledCharsmap::base64_decode(std::string_view text, const std::string& what) {
  auto sextet = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  KILN_CHECK(text.size() % 4 == 0, "tokenizer", what, " is not base64 (length ", text.size(),
             " is not a multiple of 4)");
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    const int pad = last ? (text[i + 3] == '=') + (text[i + 2] == '=' && text[i + 3] == '=') : 0;
    uint32_t group = 0;
    for (size_t k = 0; k < 4; ++k) {
      const int v = k >= size_t(4 - pad) ? 0 : sextet(text[i + k]);
      KILN_CHECK(v >= 0, "tokenizer", what, " is not base64 (character '", std::string(1, text[i + k]),
                 "' at offset ", i + k, ")");
      group = (group << 6) | uint32_t(v);
    }
    out += char((group >> 16) & 0xFF);
    if (pad < 2) out += char((group >> 8) & 0xFF);
    if (pad < 1) out += char(group & 0xFF);
  }
  return out;
}

PrecompiledCharsmap::PrecompiledCharsmap(std::string_view blob, const std::string& what) : what_(what) {
  auto u32_at = [&](size_t pos) {
    return uint32_t(static_cast<unsigned char>(blob[pos])) | uint32_t(static_cast<unsigned char>(blob[pos + 1])) << 8 |
           uint32_t(static_cast<unsigned char>(blob[pos + 2])) << 16 |
           uint32_t(static_cast<unsigned char>(blob[pos + 3])) << 24;
  };
  KILN_CHECK(blob.size() >= 4, "tokenizer", what, ": the charsmap has ", blob.size(),
             " bytes, fewer than its 4-byte trie size");
  const size_t n_units = u32_at(0) / 4;
  KILN_CHECK(n_units >= 1 && blob.size() >= 4 + 4 * n_units, "tokenizer", what, ": the charsmap declares ",
             n_units, " trie units but has ", blob.size(), " bytes");
  units_.resize(n_units);
  for (size_t i = 0; i < n_units; ++i) units_[i] = u32_at(4 + 4 * i);
  normalized_ = std::string(blob.substr(4 + 4 * n_units));
  utf8_decode(normalized_, what + " replacement strings");  // tokenizers requires UTF-8 there
}

std::optional<std::string_view> PrecompiledCharsmap::transform(std::string_view chunk) const {
  // DoubleArray::common_prefix_search, stopped at its first (shortest) result; a walk off the array is a miss.
  uint64_t pos = offset(units_[0]);
  for (char ch : chunk) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == 0) break;
    pos ^= c;
    if (pos >= units_.size()) return std::nullopt;
    const uint32_t unit = units_[pos];
    if (label(unit) != c) return std::nullopt;
    pos ^= offset(unit);
    if (pos >= units_.size()) return std::nullopt;
    if (has_leaf(unit)) {
      const size_t begin = value(units_[pos]);
      KILN_CHECK(begin <= normalized_.size(), "tokenizer", what_, ": a charsmap entry points at offset ", begin,
                 ", past the replacement strings (", normalized_.size(), " bytes)");
      const size_t end = normalized_.find('\0', begin);
      return std::string_view(normalized_).substr(begin, (end == std::string::npos ? normalized_.size() : end) - begin);
    }
  }
  return std::nullopt;
}

std::string PrecompiledCharsmap::normalize(std::string_view text) const {
  std::string out;
  out.reserve(text.size());
  for (const auto& [begin, end] : grapheme_clusters(text)) {
    const std::string_view g = text.substr(begin, end - begin);
    if (g.size() < 6)
      if (const auto whole = transform(g)) {
        out += *whole;
        continue;
      }
    for (size_t i = 0; i < g.size();) {
      const size_t n = std::min(utf8_length(static_cast<unsigned char>(g[i])), g.size() - i);
      const std::string_view ch = g.substr(i, n);
      if (const auto r = transform(ch)) out += *r;
      else out += ch;
      i += n;
    }
  }
  return out;
}

}  // namespace kiln::tokenizers
