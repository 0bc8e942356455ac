#include "tokenizers/grapheme_clusters.h"

#include <algorithm>

#include "tokenizers/unicode_text.h"

namespace kiln::tokenizers {
namespace {
using grapheme_tables::Gcb;

enum class InCB : uint8_t { kNone, kConsonant, kExtend, kLinker };

struct Props {
  Gcb gcb = Gcb::kOther;
  bool pictographic = false;
  InCB incb = InCB::kNone;
};

Props props(char32_t cp) {
  if (cp >= 0xAC00 && cp <= 0xD7A3) return {(cp - 0xAC00) % 28 == 0 ? Gcb::kLV : Gcb::kLVT, false, InCB::kNone};
  const auto* begin = grapheme_tables::kRanges;
  const auto* end = begin + grapheme_tables::kRanges_size;
  const auto* it = std::upper_bound(begin, end, cp, [](char32_t c, const grapheme_tables::Range& r) { return c < r.first; });
  if (it == begin || cp > (it - 1)->last) return {};
  const auto& r = *(it - 1);
  return {Gcb(r.gcb), (r.flags & 1) != 0, InCB((r.flags >> 1) & 3)};
}

bool is_control(Gcb g) { return g == Gcb::kControl || g == Gcb::kCR || g == Gcb::kLF; }

}  // namespace

std::vector<std::pair<size_t, size_t>> grapheme_clusters(std::string_view text) {
  std::vector<std::pair<size_t, size_t>> out;
  if (text.empty()) return out;
  char32_t cp;
  size_t pos = utf8_char(text, 0, cp);
  Props prev = props(cp);
  size_t start = 0;
  // Context of the characters since the last break that the multi-character rules look back on.
  size_t ri_run = prev.gcb == Gcb::kRegionalIndicator ? 1 : 0;  // GB12/13: regional indicators in a row
  bool emoji = prev.pictographic, emoji_zwj = false;            // GB11: ExtPict Extend* (ZWJ)
  bool conjunct = prev.incb == InCB::kConsonant, linker = false;  // GB9c: Consonant [Extend Linker]* with a Linker
  while (pos < text.size()) {
    const size_t n = utf8_char(text, pos, cp);
    const Props cur = props(cp);
    const Gcb a = prev.gcb, b = cur.gcb;
    bool join;
    if (a == Gcb::kCR && b == Gcb::kLF) join = true;                   // GB3
    else if (is_control(a) || is_control(b)) join = false;             // GB4, GB5
    else if (a == Gcb::kL && (b == Gcb::kL || b == Gcb::kV || b == Gcb::kLV || b == Gcb::kLVT)) join = true;  // GB6
    else if ((a == Gcb::kLV || a == Gcb::kV) && (b == Gcb::kV || b == Gcb::kT)) join = true;                   // GB7
    else if ((a == Gcb::kLVT || a == Gcb::kT) && b == Gcb::kT) join = true;                                    // GB8
    else if (b == Gcb::kExtend || b == Gcb::kZWJ || b == Gcb::kSpacingMark || a == Gcb::kPrepend) join = true;  // GB9-9b
    else if (cur.incb == InCB::kConsonant && conjunct && linker) join = true;                                  // GB9c
    else if (cur.pictographic && emoji_zwj && a == Gcb::kZWJ) join = true;                                     // GB11
    else if (a == Gcb::kRegionalIndicator && b == Gcb::kRegionalIndicator) join = ri_run % 2 == 1;            // GB12/13
    else join = false;                                                                                         // GB999
    if (!join) {
      out.emplace_back(start, pos);
      start = pos;
    }
    // Update the look-back state with `cur`.
    ri_run = b == Gcb::kRegionalIndicator ? ri_run + 1 : 0;
    if (cur.pictographic) emoji = true, emoji_zwj = false;
    else if (emoji && b == Gcb::kExtend && !emoji_zwj) emoji = true;
    else if (emoji && b == Gcb::kZWJ && !emoji_zwj) emoji_zwj = true;
    else emoji = emoji_zwj = false;
    if (cur.incb == InCB::kConsonant) conjunct = true, linker = false;
    else if (conjunct && cur.incb == InCB::kLinker) linker = true;
    else if (conjunct && cur.incb == InCB::kExtend) {
    } else conjunct = linker = false;
    prev = cur;
    pos += n;
  }
  out.emplace_back(start, text.size());
  return out;
}

}  // namespace kiln::tokenizers
