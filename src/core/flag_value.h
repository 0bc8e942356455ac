// Command-line flag values: integers as the CLI and the call argument table read them, each
// error one line naming the flag ("[cli] flag --steps expects an integer, got 'many'").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

int64_t parse_int(const std::string& flag, const std::string& value);
// "7,8,9" -> {7, 8, 9}.
std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& value);

}  // namespace kiln
