#include "core/flag_value.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "core/error.h"

namespace kiln {

namespace {

// parse(value, &used) (a std::sto* function) with its exceptions as used 0.
template <typename T, typename Parse>
std::pair<T, size_t> leading(const std::string& value, Parse parse) {
  size_t used = 0;
  try {
    const T x = parse(value, &used);
    return {x, used};
  } catch (const std::exception&) {
    return {T{}, 0};
  }
}

template <typename T, typename Parse>
std::optional<T> whole(const std::string& value, Parse parse) {
  const auto [x, used] = leading<T>(value, parse);
  if (value.empty() || used != value.size()) return std::nullopt;
  return x;
}

}  // namespace

LeadingNumber leading_number(const std::string& value) {
  const auto [x, used] = leading<double>(value, [](const std::string& v, size_t* u) { return std::stod(v, u); });
  return {x, used};
}

std::optional<int64_t> whole_int(const std::string& value) {
  return whole<int64_t>(value, [](const std::string& v, size_t* u) { return std::stoll(v, u); });
}

std::optional<uint64_t> whole_uint(const std::string& value) {
  if (value.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return whole<uint64_t>(value, [](const std::string& v, size_t* u) { return std::stoull(v, u); });
}

std::optional<double> whole_number(const std::string& value) {
  return whole<double>(value, [](const std::string& v, size_t* u) { return std::stod(v, u); });
}

int64_t parse_int(const std::string& flag, const std::string& v) {
  const std::optional<int64_t> x = whole_int(v);
  KILN_CHECK(x.has_value(), "cli", "flag ", flag, " expects an integer, got '", v, "'");
  return *x;
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
