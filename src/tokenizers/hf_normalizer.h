// The normalizers of tokenizer.json that kiln's reader runs (HfTokenizer parses them; see hf_tokenizer.h),
// with the `tokenizers` library's semantics:
//
//   NFC          unicodedata's NFC
//   Precompiled  SentencePiece's charsmap (precompiled_charsmap.h)
//   Replace      every non-overlapping match of a String (literal) or Regex pattern, left to right, replaced
//                by `content`
//   Strip        char::is_whitespace (Unicode White_Space) removed on the left and/or right
//
// A Sequence is the steps in order.
#pragma once
#include <memory>
#include <string>
#include <vector>

namespace kiln::tokenizers {

class PrecompiledCharsmap;
class Regex;

struct NormalizerStep {
  enum class Kind { kNFC, kPrecompiled, kReplace, kStrip } kind = Kind::kNFC;
  std::shared_ptr<const PrecompiledCharsmap> charsmap;  // kPrecompiled
  std::shared_ptr<const Regex> regex;                   // kReplace with a Regex pattern, else `literal`
  std::string literal, content;                         // kReplace
  bool strip_left = false, strip_right = false;         // kStrip
};

// `text` through the steps. `keeps_start`, when given, is cleared if a step deleted the text's first
// characters (Strip on the left, a Replace by nothing at offset 0): tokenizers then no longer counts the
// result as starting at the input's offset 0, which Metaspace's prepend_scheme "first" looks at.
std::string normalize(const std::vector<NormalizerStep>& steps, std::string text, bool* keeps_start = nullptr);

// Rust's char::is_whitespace (the Unicode White_Space property).
bool is_white_space(char32_t c);

}  // namespace kiln::tokenizers
