// Lines kiln prints for a person to read (errors, warnings, progress, inspect's listing) quote
// what files and flags hold: tensor names, merges.txt lines, component names, paths. A terminal
// obeys control bytes in them (ESC sequences recolour text, move the cursor, retitle the window
// or, in some terminals, answer back as typed input; CR and newlines forge lines), so every such
// line goes out through print_line, which writes them escaped.
#pragma once
#include <cstdarg>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

// `text` with every control character written as \xNN per byte: C0 (newline and tab included,
// so a line read from data stays one line; '\n' kept with `keep_newlines`), DEL, C1
// (U+0080..U+009F in UTF-8, which terminals obey like ESC + a letter) and every byte that is not
// part of valid UTF-8 (a lone 0x9b is C1's CSI to an 8-bit terminal). Other UTF-8, a prompt in
// Japanese say, is kept. Backslashes are kept as they are, so escaping twice gives the same text
// (an error quoting another error's message).
inline std::string escape_controls(std::string_view text, bool keep_newlines = false);

// printf into one line, escaped as above, then kiln's own '\n': the sink for every line kiln
// prints that may quote a file, a flag or the environment (a '\n' inside is escaped: it came
// from a value, since kiln's own lines are printed one call each).
inline void print_line(std::FILE* out, const char* format, ...) __attribute__((format(printf, 2, 3)));

// Text whose line breaks are kiln's own, a kiln::Error's message (format_error escaped those of
// the values it quotes): one print_line per line, the first after `prefix` ("kiln: ").
inline void print_lines(std::FILE* out, const char* prefix, std::string_view text);

// Header-only: error.h's format_error uses escape_controls everywhere.
namespace detail {

// The length of the valid UTF-8 sequence at `s[i]` that encodes a printable code point (2 to 4
// bytes), or 0: an ASCII byte, a malformed or overlong sequence, a surrogate, or a C1 control.
inline size_t printable_sequence(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char lead = b(0);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
  if (lead >= 0xc2 && lead <= 0xdf) n = 2;
  else if (lead >= 0xe0 && lead <= 0xef) n = 3, lo = lead == 0xe0 ? 0xa0 : 0x80, hi = lead == 0xed ? 0x9f : 0xbf;
  else if (lead >= 0xf0 && lead <= 0xf4) n = 4, lo = lead == 0xf0 ? 0x90 : 0x80, hi = lead == 0xf4 ? 0x8f : 0xbf;
  if (n == 0 || i + n > s.size() || b(1) < lo || b(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (b(k) < 0x80 || b(k) > 0xbf) return 0;
  if (lead == 0xc2 && b(1) <= 0x9f) return 0;  // U+0080..U+009F: C1 controls
  return n;
}

}  // namespace detail

inline std::string escape_controls(std::string_view text, bool keep_newlines) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c >= 0x20 && c < 0x7f) || (c == '\n' && keep_newlines)) {
      out += char(c);
      ++i;
    } else if (const size_t n = c >= 0x80 ? detail::printable_sequence(text, i) : 0; n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
      ++i;
    }
  }
  return out;
}

inline void print_line(std::FILE* out, const char* format, ...) {
  va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::vector<char> buf(size_t(n > 0 ? n : 0) + 1);
  std::vsnprintf(buf.data(), buf.size(), format, again);
  va_end(again);
  const std::string line = escape_controls(std::string_view(buf.data(), buf.size() - 1)) + '\n';
  std::fwrite(line.data(), 1, line.size(), out);
}

inline void print_lines(std::FILE* out, const char* prefix, std::string_view text) {
  for (size_t start = 0;;) {
    const size_t nl = text.find('\n', start);
    const std::string_view line = text.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start);
    print_line(out, "%s%.*s", start == 0 ? prefix : "", int(line.size()), line.data());
    if (nl == std::string_view::npos || nl + 1 == text.size()) break;  // no empty line after the last
    start = nl + 1;
  }
}

}  // namespace kiln
