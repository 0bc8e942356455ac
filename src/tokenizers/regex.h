// A small PCRE2 wrapper for the tokenizers: Unicode-aware patterns (UTF + UCP, so \p{L}, \s, ...
// follow Unicode like Python's `regex` module) compiled once and shared between threads.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct pcre2_real_code_8;

namespace kiln::tokenizers {

class Regex {
 public:
  // Compiles `pattern`; `caseless` adds PCRE2_CASELESS. Errors name the pattern and offset.
  explicit Regex(const std::string& pattern, bool caseless = false);

  // Byte spans [begin, end) of the successive non-overlapping matches in `text` (valid UTF-8),
  // as Python's re.findall walks them.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
  // `text` with every match replaced by `replacement` (taken literally).
  std::string replace_all(std::string_view text, std::string_view replacement) const;
  // True when the whole of `text` matches.
  bool full_match(std::string_view text) const;

 private:
  std::shared_ptr<const pcre2_real_code_8> code_;
  std::string pattern_;
};

}  // namespace kiln::tokenizers
