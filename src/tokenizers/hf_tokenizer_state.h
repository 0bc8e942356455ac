// The state behind HfTokenizer (tokenizers/hf_tokenizer.h): what hf_tokenizer_json.cc reads
// out of tokenizer.json and hf_tokenizer.cc runs. Private to those two files.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizers/hf_normalizer.h"
#include "tokenizers/hf_tokenizer.h"
#include "tokenizers/regex.h"
#include "tokenizers/unicode_text.h"
#include "tokenizers/unigram_model.h"

namespace kiln::tokenizers {
namespace hf {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

enum class Prepend { kAlways, kFirst, kNever };

struct PreStep {
  enum class Kind { kSplit, kByteLevel, kWhitespaceSplit, kMetaspace } kind = Kind::kSplit;
  // Split
  std::shared_ptr<const Regex> regex;  // null: `literal` is the pattern
  std::string literal;
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  // ByteLevel
  bool add_prefix_space = false, use_regex = false;
  // Metaspace: spaces become `replacement` (one character), which is put in front per `prepend` and split on
  bool split = true;
  std::string replacement;
  Prepend prepend = Prepend::kAlways;
};

struct AddedTok {
  std::string content;  // for normalized tokens: the normalized content
  int64_t id = -1;
  bool special = false, normalized = false, lstrip = false, rstrip = false, single_word = false;
};

// The added tokens matched in one pass (raw text or normalized text), indexed by first byte, longest first.
struct Matcher {
  std::vector<AddedTok> tokens;
  std::array<std::vector<size_t>, 256> by_first_byte;

  void build() {
    for (size_t i = 0; i < tokens.size(); ++i)
      by_first_byte[static_cast<unsigned char>(tokens[i].content[0])].push_back(i);
    for (auto& v : by_first_byte)
      std::stable_sort(v.begin(), v.end(),
                       [&](size_t a, size_t b) { return tokens[a].content.size() > tokens[b].content.size(); });
  }
  // Leftmost-longest match at or after `from`: token index, or -1.
  int64_t find(std::string_view text, size_t from, size_t& at) const {
    for (size_t pos = from; pos < text.size(); ++pos)
      for (size_t i : by_first_byte[static_cast<unsigned char>(text[pos])])
        if (text.compare(pos, tokens[i].content.size(), tokens[i].content) == 0) {
          at = pos;
          return int64_t(i);
        }
    return -1;
  }
};

// Text still to tokenize (id < 0) or an added token.
struct Piece {
  std::string text;
  int64_t id = -1;
};

inline uint64_t pair_key(int64_t a, int64_t b) { return (uint64_t(uint32_t(a)) << 32) | uint64_t(uint32_t(b)); }

// tokenizers compiles patterns with Oniguruma, whose \s is Unicode White_Space; PCRE2's \s (with UCP) also
// matches U+180E MONGOLIAN VOWEL SEPARATOR. Rewrites \s and \S, bare or inside a character class, so that
// U+180E falls on Oniguruma's side. (\w and \d are left to PCRE2; the Qwen2/Tekken/GPT-2 patterns use neither.)
std::string oniguruma_spaces(const std::string& p);

}  // namespace hf

struct HfTokenizer::State {
  std::string source;
  std::vector<NormalizerStep> normalizers;
  std::vector<hf::PreStep> pre_steps;
  // model: BPE (vocab, merges) or Unigram (`unigram`, with `vocab` its token -> id map)
  std::shared_ptr<const UnigramModel> unigram;
  int64_t model_size = 0;  // the model's get_vocab_size()
  std::unordered_map<std::string, int64_t> vocab;
  std::unordered_map<uint64_t, std::pair<int64_t, int64_t>> merges;  // (left, right) -> (rank, merged id)
  bool ignore_merges = false, fuse_unk = false;
  int64_t unk = -1;
  // added tokens
  hf::Matcher raw_tokens, normalized_tokens;
  std::unordered_map<std::string, int64_t> added_ids;  // content -> id
  std::unordered_map<int64_t, std::string> added_text;
  // post-processor: the single templates, applied in order; each element is a special token's ids, or
  // nullopt for the sequence ($A)
  std::vector<std::vector<std::optional<std::vector<int64_t>>>> templates;

  std::array<std::string, 256> bytes = byte_encoder();
  std::vector<std::string> vocab_r;  // id -> token (for tokenize())

  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache;

  std::string normalize(const std::string& text, bool* keeps_start = nullptr) const {
    return kiln::tokenizers::normalize(normalizers, text, keeps_start);
  }
  std::vector<std::string> pre_tokenize(const std::string& text, bool at_origin) const;
  void bpe(const std::string& word, std::vector<int64_t>& out) const;
  void run_model(const std::string& word, std::vector<int64_t>& out) const {
    if (unigram) unigram->encode(word, out);
    else bpe(word, out);
  }
  std::vector<hf::Piece> pieces(const std::string& text) const;  // model ids in Piece::id per token
  // The post-processor's templates around `ids`.
  std::vector<int64_t> apply_templates(std::vector<int64_t> ids) const {
    for (const auto& tmpl : templates) {
      std::vector<int64_t> out;
      for (const auto& e : tmpl) {
        const auto& part = e ? *e : ids;
        out.insert(out.end(), part.begin(), part.end());
      }
      ids = std::move(out);
    }
    return ids;
  }
  int64_t n_special() const {
    int64_t n = 0;
    for (const auto& t : templates)
      for (const auto& e : t)
        if (e) n += int64_t(e->size());
    return n;
  }
};

// tokenizer.json's content as a tokenizer; every error names `source` and the JSON path.
std::shared_ptr<HfTokenizer::State> parse_tokenizer_json(const nlohmann::json& j, const std::string& source);

}  // namespace kiln::tokenizers
