// Unicode text operations with Python's semantics, for the tokenizers' text cleanup: UTF-8
// decoding/encoding, NFC (unicodedata.normalize("NFC")), str.lower() and str.isspace().
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace kiln::tokenizers {

// Decodes UTF-8; invalid input (bad bytes, overlongs, surrogates) is a kiln::Error naming `what`.
std::u32string utf8_decode(std::string_view text, const std::string& what);
std::string utf8_encode(std::u32string_view text);
void utf8_append(std::string& out, char32_t cp);
// The code point at text[i] into `cp` (valid UTF-8 assumed, as utf8_decode checks it); returns its
// length in bytes, cut short at the end of `text`. Inline: the tokenizers call it per character.
inline size_t utf8_char(std::string_view text, size_t i, char32_t& cp) {
  const auto b = static_cast<unsigned char>(text[i]);
  size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  n = std::min(n, text.size() - i);
  cp = n == 1 ? b : char32_t(b & (0xFF >> (n + 1)));
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
  return n;
}

// GPT-2's byte-level alphabet (bytes_to_unicode): each byte as the UTF-8 of a printable code
// point, the printable ASCII and Latin-1 bytes as themselves. CLIP's BPE and tokenizer.json's
// ByteLevel pre-tokenizer both spell bytes this way.
std::array<std::string, 256> byte_encoder();

// unicodedata.normalize("NFC", text).
std::u32string nfc(std::u32string_view text);
// str.lower(): full lowercase mapping, including U+0130 -> "i\u0307" and the Final_Sigma rule.
std::u32string python_lower(std::u32string_view text);
// str.isspace() for one character.
bool python_isspace(char32_t cp);
// BERT's _is_chinese_char: the CJK Unified Ideograph blocks (not all of CJK).
bool is_cjk_ideograph(char32_t cp);

}  // namespace kiln::tokenizers
