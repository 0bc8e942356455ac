#include "tokenizers/hf_normalizer.h"

#include "tokenizers/precompiled_charsmap.h"
#include "tokenizers/regex.h"
#include "tokenizers/unicode_text.h"

namespace kiln::tokenizers {

bool is_white_space(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {

std::string strip(const std::string& text, bool left, bool right) {
  const std::u32string cps = utf8_decode(text, "text");
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && is_white_space(cps[b])) ++b;
  if (right)
    while (e > b && is_white_space(cps[e - 1])) --e;
  return utf8_encode(std::u32string_view(cps).substr(b, e - b));
}

std::string replace_literal(const std::string& text, const std::string& pattern, const std::string& content,
                            bool& replaced_start) {
  if (pattern.empty()) return text;  // tokenizers: an empty String pattern matches nothing
  std::string out;
  size_t from = 0;
  for (size_t at = text.find(pattern); at != std::string::npos; at = text.find(pattern, from)) {
    if (at == 0) replaced_start = true;
    out.append(text, from, at - from);
    out += content;
    from = at + pattern.size();
  }
  out.append(text, from, std::string::npos);
  return out;
}

}  // namespace

std::string normalize(const std::vector<NormalizerStep>& steps, std::string text, bool* keeps_start) {
  for (const auto& step : steps) {
    if (text.empty()) break;
    switch (step.kind) {
      case NormalizerStep::Kind::kNFC:
        text = utf8_encode(nfc(utf8_decode(text, "text")));
        break;
      case NormalizerStep::Kind::kPrecompiled:
        text = step.charsmap->normalize(text);
        break;
      case NormalizerStep::Kind::kReplace: {
        bool replaced_start = false;
        if (step.regex) {
          const auto spans = step.regex->find_all(text);
          replaced_start = !spans.empty() && spans.front().first == 0;
          text = step.regex->replace_all(text, step.content);
        } else {
          text = replace_literal(text, step.literal, step.content, replaced_start);
        }
        if (replaced_start && step.content.empty() && keeps_start) *keeps_start = false;
        break;
      }
      case NormalizerStep::Kind::kStrip: {
        std::string stripped = strip(text, step.strip_left, step.strip_right);
        if (step.strip_left && keeps_start && (stripped.empty() || text.compare(0, stripped.size(), stripped) != 0))
          *keeps_start = false;
        text = std::move(stripped);
        break;
      }
    }
  }
  return text;
}

}  // namespace kiln::tokenizers
