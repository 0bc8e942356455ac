// Command-line flag values: integers as the CLI and the call argument table read them, each
// error one line naming the flag ("[cli] flag --steps expects an integer, got 'many'").
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

// The number at the start of `value` (std::stod without its exceptions) and how many characters
// it took: used 0 when there is none or it is out of range.
struct LeadingNumber {
  double value = 0;
  size_t used = 0;
};
LeadingNumber leading_number(const std::string& value);
// `value` whole as a number: std::nullopt when it is empty, has anything after the number, or is
// out of range.
std::optional<int64_t> whole_int(const std::string& value);
std::optional<uint64_t> whole_uint(const std::string& value);  // digits only: no sign, no space
std::optional<double> whole_number(const std::string& value);

int64_t parse_int(const std::string& flag, const std::string& value);
// "7,8,9" -> {7, 8, 9}.
std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& value);

}  // namespace kiln
