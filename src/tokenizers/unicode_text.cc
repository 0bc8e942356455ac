#include "tokenizers/unicode_text.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "tokenizers/regex.h"
#include "tokenizers/unicode_tables.h"

namespace kiln::tokenizers {
namespace {

// Hangul syllables compose and decompose algorithmically (Unicode §3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint8_t combining_class(char32_t cp) {
  const auto* begin = tables::kCombiningClasses;
  const auto* end = begin + tables::kCombiningClasses_size;
  const auto* it = std::upper_bound(begin, end, cp, [](char32_t c, const tables::CccRange& r) { return c < r.first; });
  if (it == begin) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

const tables::Decomposition* find_decomposition(char32_t cp) {
  const auto* begin = tables::kDecompositions;
  const auto* end = begin + tables::kDecompositions_size;
  const auto* it = std::lower_bound(begin, end, cp, [](const tables::Decomposition& d, char32_t c) { return d.cp < c; });
  return it != end && it->cp == cp ? it : nullptr;
}

void decompose(char32_t cp, std::u32string& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (const auto* d = find_decomposition(cp)) {
    decompose(d->first, out);
    if (d->second != 0) decompose(d->second, out);
    return;
  }
  out.push_back(cp);
}

// (first << 21 | second) -> primary composite.
const std::unordered_map<uint64_t, char32_t>& compositions() {
  static const auto map = [] {
    std::unordered_map<uint64_t, char32_t> m;
    for (size_t i = 0; i < tables::kDecompositions_size; ++i) {
      const auto& d = tables::kDecompositions[i];
      if (d.composes) m.emplace(uint64_t(d.first) << 21 | d.second, d.cp);
    }
    return m;
  }();
  return map;
}

char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto& m = compositions();
  const auto it = m.find(uint64_t(a) << 21 | b);
  return it == m.end() ? 0 : it->second;
}

char32_t simple_lower(char32_t cp) {
  const auto* begin = tables::kLowerRuns;
  const auto* end = begin + tables::kLowerRuns_size;
  const auto* it = std::upper_bound(begin, end, cp, [](char32_t c, const tables::LowerRun& r) { return c < r.first; });
  if (it == begin) return cp;
  --it;
  if (cp > it->last || (cp - it->first) % it->stride != 0) return cp;
  return char32_t(int64_t(cp) + it->delta);
}

// The Unicode properties Python's Final_Sigma test uses (PCRE2 10.42 and Python 3.11 both
// carry Unicode 14).
bool has_property(const Regex& re, char32_t cp) {
  std::string s;
  utf8_append(s, cp);
  return re.full_match(s);
}
bool is_cased(char32_t cp) {
  static const Regex re("\\p{Cased}");
  return has_property(re, cp);
}
bool is_case_ignorable(char32_t cp) {
  static const Regex re("\\p{Case_Ignorable}");
  return has_property(re, cp);
}

// CPython's handle_capital_sigma: \p{cased} \p{case-ignorable}* U+03A3 !(\p{case-ignorable}* \p{cased}).
char32_t lower_sigma(std::u32string_view text, size_t i) {
  size_t j = i;
  while (j > 0 && is_case_ignorable(text[j - 1])) --j;
  bool final_sigma = j > 0 && is_cased(text[j - 1]);
  if (final_sigma) {
    size_t k = i + 1;
    while (k < text.size() && is_case_ignorable(text[k])) ++k;
    final_sigma = k == text.size() || !is_cased(text[k]);
  }
  return final_sigma ? 0x3C2 : 0x3C3;
}

}  // namespace

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_encode(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t cp : text) utf8_append(out, cp);
  return out;
}

std::u32string utf8_decode(std::string_view text, const std::string& what) {
  std::u32string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    size_t n = 0;
    char32_t cp = 0, min = 0;
    if (b0 < 0x80) n = 1, cp = b0;
    else if ((b0 & 0xE0) == 0xC0) n = 2, cp = b0 & 0x1F, min = 0x80;
    else if ((b0 & 0xF0) == 0xE0) n = 3, cp = b0 & 0x0F, min = 0x800;
    else if ((b0 & 0xF8) == 0xF0) n = 4, cp = b0 & 0x07, min = 0x10000;
    bool ok = n > 0 && i + n <= text.size();
    for (size_t k = 1; ok && k < n; ++k) {
      const auto b = static_cast<unsigned char>(text[i + k]);
      ok = (b & 0xC0) == 0x80;
      cp = (cp << 6) | (b & 0x3F);
    }
    ok = ok && cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    if (!ok) fail("tokenizer", what, " is not valid UTF-8 (byte offset ", i, ")");
    out.push_back(cp);
    i += n;
  }
  return out;
}

std::u32string nfc(std::u32string_view text) {
  // 1. Full canonical decomposition.
  std::u32string d;
  d.reserve(text.size());
  for (char32_t cp : text) decompose(cp, d);
  // 2. Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < d.size();) {
    if (combining_class(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && combining_class(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j,
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  // 3. Canonical composition: a character joins the last starter unless it is blocked (an
  // earlier character since that starter has a class of 0 or >= its own).
  std::u32string out;
  out.reserve(d.size());
  size_t starter = std::u32string::npos;
  int last_ccc = -1;
  for (char32_t cp : d) {
    const int ccc = combining_class(cp);
    if (starter != std::u32string::npos) {
      const bool blocked = last_ccc != -1 && (last_ccc == 0 || last_ccc >= ccc);
      if (!blocked) {
        if (const char32_t c = compose_pair(out[starter], cp)) {
          out[starter] = c;
          continue;
        }
      }
    }
    if (ccc == 0) {
      starter = out.size();
      last_ccc = -1;
    } else {
      last_ccc = ccc;
    }
    out.push_back(cp);
  }
  return out;
}

std::u32string python_lower(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char32_t cp = text[i];
    if (cp == 0x130) {  // the one unconditional multi-character lowercase mapping
      out.push_back(U'i');
      out.push_back(0x307);
    } else if (cp == 0x3A3) {
      out.push_back(lower_sigma(text, i));
    } else {
      out.push_back(simple_lower(cp));
    }
  }
  return out;
}

bool python_isspace(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x1C: case 0x1D: case 0x1E: case 0x1F:
    case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_cjk_ideograph(char32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

std::array<std::string, 256> byte_encoder() {
  std::array<std::string, 256> enc;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    utf8_append(enc[b], keep ? char32_t(b) : next++);
  }
  return enc;
}

}  // namespace kiln::tokenizers
