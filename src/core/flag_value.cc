#include "core/flag_value.h"

#include <algorithm>
#include <stdexcept>

#include "core/error.h"

namespace kiln {

int64_t parse_int(const std::string& flag, const std::string& v) {
  size_t used = 0;
  int64_t x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KILN_CHECK(used == v.size() && !v.empty(), "cli", "flag ", flag, " expects an integer, got '", v, "'");
  return x;
}

std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& v) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= v.size()) {
    const size_t comma = std::min(v.find(',', start), v.size());
    out.push_back(parse_int(flag, v.substr(start, comma - start)));
    start = comma + 1;
  }
  return out;
}

}  // namespace kiln
