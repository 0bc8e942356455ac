// SentencePiece's precompiled normalization rules (the "Precompiled" normalizer of tokenizer.json files,
// e.g. T5's NFKC-like nmt_nfkc map), applied as the `tokenizers` library applies them (its spm_precompiled
// crate and normalizers/precompiled.rs):
//
//   PrecompiledCharsmap map(PrecompiledCharsmap::base64_decode(b64, "normalizer.precompiled_charsmap"), what);
//   std::string normalized = map.normalize("ＡＢＣ ﬁ");  // "ABC fi"
//
// The charsmap is [u32 little-endian trie size in bytes][darts-clone double-array trie of u32 units]
// [replacement strings, each ending in '\0']; the trie maps a UTF-8 key to the offset of its replacement.
// The text is walked by extended grapheme clusters: a cluster shorter than 6 bytes is replaced whole when a
// prefix of it is a key (the shortest such key, as tokenizers does), otherwise each of its characters is
// replaced on its own when it is a key and kept when not.
//
// Clusters come from grapheme_clusters.h (UAX #29 with the Unicode data of its generated tables).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tokenizers {

class PrecompiledCharsmap {
 public:
  // Parses the raw (decoded) charsmap; a truncated blob or replacement strings that are not UTF-8 are
  // errors naming `what`.
  PrecompiledCharsmap(std::string_view blob, const std::string& what);

  // Standard base64 (RFC 4648, '=' padding); anything else is an error naming `what`.
  static std::string base64_decode(std::string_view text, const std::string& what);

  // `text` (valid UTF-8) with the rules applied.
  std::string normalize(std::string_view text) const;

 private:
  // The replacement of the shortest key that is a prefix of `chunk`, if any.
  std::optional<std::string_view> transform(std::string_view chunk) const;

  std::string what_;
  std::vector<uint32_t> units_;
  std::string normalized_;
};

}  // namespace kiln::tokenizers
