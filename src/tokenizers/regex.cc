#include "tokenizers/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace kiln::tokenizers {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<const char*>(buf));
}

// Match data sized for the pattern, freed on scope exit.
struct MatchData {
  explicit MatchData(const pcre2_code* code) : md(pcre2_match_data_create_from_pattern(code, nullptr)) {
    KILN_CHECK(md != nullptr, "tokenizer", "out of memory for regex match data");
  }
  ~MatchData() { pcre2_match_data_free(md); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
  pcre2_match_data* md;
};

}  // namespace

Regex::Regex(const std::string& pattern, bool caseless) : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  const uint32_t flags = PCRE2_UTF | PCRE2_UCP | (caseless ? PCRE2_CASELESS : 0u);
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), flags, &err, &offset, nullptr);
  if (code == nullptr)
    fail("tokenizer", "cannot compile regex '", pattern, "' at offset ", offset, ": ", pcre2_message(err));
  code_ = std::shared_ptr<const pcre2_code>(code, [](const pcre2_code* c) { pcre2_code_free(const_cast<pcre2_code*>(c)); });
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> spans;
  MatchData data(code_.get());
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos <= text.size()) {
    const int rc = pcre2_match(code_.get(), subject, text.size(), pos, 0, data.md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("tokenizer", "regex '", pattern_, "' failed: ", pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data.md);
    const size_t begin = ov[0], end = ov[1];
    if (end > begin) {
      spans.emplace_back(begin, end);
      pos = end;
    } else {
      // An empty match: step over one UTF-8 character, as Python does.
      pos = end + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  return spans;
}

std::string Regex::replace_all(std::string_view text, std::string_view replacement) const {
  std::string out;
  out.reserve(text.size());
  size_t last = 0;
  for (const auto& [begin, end] : find_all(text)) {
    out.append(text.substr(last, begin - last));
    out.append(replacement);
    last = end;
  }
  out.append(text.substr(last));
  return out;
}

bool Regex::full_match(std::string_view text) const {
  MatchData data(code_.get());
  const int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                             PCRE2_ANCHORED | PCRE2_ENDANCHORED, data.md, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) fail("tokenizer", "regex '", pattern_, "' failed: ", pcre2_message(rc));
  return true;
}

}  // namespace kiln::tokenizers
