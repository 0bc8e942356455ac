// Errors: every engine error is a kiln::Error whose message starts with the op or
// component name in brackets, e.g. "[matmul] inner dims differ: [2,3] x [4,5]".
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
inline void append(std::ostringstream&) {}
template <typename T, typename... Rest>
void append(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  append(os, rest...);
}
}  // namespace detail

// Builds "[where] part1part2..." from streamable parts.
template <typename... Parts>
std::string format_error(const std::string& where, const Parts&... parts) {
  std::ostringstream os;
  os << '[' << where << "] ";
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
