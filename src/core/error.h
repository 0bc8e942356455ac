// Errors: every engine error is a kiln::Error whose message starts with the op or
// component name in brackets, e.g. "[matmul] inner dims differ: [2,3] x [4,5]".
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "core/terminal.h"

namespace kiln {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A message part whose line breaks kiln means (a program listing under an internal error): its
// other control characters are escaped, its '\n' kept.
struct Lines {
  std::string text;
};

namespace detail {
// A string literal is kiln's own text, kept as written.
template <size_t N>
void append_part(std::ostringstream& os, const char (&literal)[N]) {
  os << literal;
}
inline void append_part(std::ostringstream& os, const Lines& lines) { os << escape_controls(lines.text, true); }
// Any other part is a value (a name, a path, a line read from a file, a number) and may hold
// control characters a terminal would obey: escaped here, where values enter a message, so a
// message's only line breaks are kiln's (core/terminal.h).
template <typename T>
void append_part(std::ostringstream& os, const T& value) {
  if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    os << escape_controls(value);
  } else {
    std::ostringstream v;
    v << value;
    os << escape_controls(v.str());
  }
}
inline void append(std::ostringstream&) {}
template <typename T, typename... Rest>
void append(std::ostringstream& os, const T& v, const Rest&... rest) {
  append_part(os, v);
  append(os, rest...);
}
}  // namespace detail

// Builds "[where] part1part2..." from streamable parts; the values among them escaped
// (escape_controls), the string literals kept.
template <typename... Parts>
std::string format_error(const std::string& where, const Parts&... parts) {
  std::ostringstream os;
  os << '[' << escape_controls(where) << "] ";
  detail::append(os, parts...);
  return os.str();
}

template <typename... Parts>
[[noreturn]] void fail(const std::string& where, const Parts&... parts) {
  throw Error(format_error(where, parts...));
}

}  // namespace kiln

// Checks a condition and throws kiln::Error("[where] ...") when it does not hold.
#define KILN_CHECK(cond, where, ...)               \
  do {                                             \
    if (!(cond)) ::kiln::fail((where), __VA_ARGS__); \
  } while (0)
