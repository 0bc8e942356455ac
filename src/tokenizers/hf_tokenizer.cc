#include "tokenizers/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <climits>
#include <functional>
#include <mutex>
#include <optional>
#include <queue>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_config.h"
#include "tokenizers/hf_normalizer.h"
#include "tokenizers/precompiled_charsmap.h"
#include "tokenizers/regex.h"
#include "tokenizers/tokenizer_files.h"
#include "tokenizers/unicode_text.h"
#include "tokenizers/unigram_model.h"

namespace kiln::tokenizers {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The pattern of tokenizers' ByteLevel pre-tokenizer with use_regex (GPT-2's).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// The BPE cache keeps words shorter than this many bytes, at most kCacheCapacity of them (as tokenizers).
constexpr size_t kCacheMaxLength = 256;
constexpr size_t kCacheCapacity = 10000;


// Decodes the UTF-8 character at text[i] (valid UTF-8 assumed); returns its length in bytes.
size_t utf8_char(std::string_view text, size_t i, char32_t& cp) {
  const auto b = static_cast<unsigned char>(text[i]);
  size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  n = std::min(n, text.size() - i);
  cp = n == 1 ? b : char32_t(b & (0xFF >> (n + 1)));
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
  return n;
}
size_t utf8_len_at(std::string_view text, size_t i) {
  char32_t cp;
  return utf8_char(text, i, cp);
}

// Regex \s*$ of the text before an lstrip token: where its trailing whitespace starts.
size_t space_leftmost_at_end(std::string_view s) {
  size_t start = s.size();
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    const size_t n = utf8_char(s, i, cp);
    if (!is_white_space(cp)) start = s.size();
    else if (start == s.size()) start = i;
    i += n;
  }
  return start;
}
// Regex ^\s* of the text after an rstrip token: where its leading whitespace ends.
size_t space_rightmost_at_start(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp;
    const size_t n = utf8_char(s, i, cp);
    if (!is_white_space(cp)) break;
    i += n;
  }
  return i;
}

// Regex \w (Rust: Alphabetic, marks, decimal numbers, connector punctuation, joiners), for single_word.
const Regex& word_char() {
  static const Regex re(R"([\p{L}\p{Nl}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])");
  return re;
}
bool starts_with_word(std::string_view s) {
  return !s.empty() && word_char().full_match(s.substr(0, utf8_len_at(s, 0)));
}
bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return word_char().full_match(s.substr(i));
}

// tokenizers compiles patterns with Oniguruma, whose \s is Unicode White_Space; PCRE2's \s (with UCP) also
// matches U+180E MONGOLIAN VOWEL SEPARATOR. Rewrites \s and \S, bare or inside a character class, so that
// U+180E falls on Oniguruma's side. (\w and \d are left to PCRE2; the Qwen2/Tekken/GPT-2 patterns use neither.)
std::string oniguruma_spaces(const std::string& p) {
  const std::string mvs = "\\x{180E}";
  const std::string not_space = "(?!" + mvs + ")";
  std::string out;
  size_t i = 0;
  while (i < p.size()) {
    if (p[i] == '\\' && i + 1 < p.size()) {
      if (p[i + 1] == 's') out += "(?:" + not_space + "\\s)";
      else if (p[i + 1] == 'S') out += "(?:" + mvs + "|\\S)";
      else out += p.substr(i, 2);
      i += 2;
      continue;
    }
    if (p[i] != '[') {
      out += p[i++];
      continue;
    }
    // A character class: find its end, noting \s / \S inside.
    size_t j = i + 1;
    const bool negated = j < p.size() && p[j] == '^';
    if (negated) ++j;
    if (j < p.size() && p[j] == ']') ++j;  // a leading ']' is literal
    bool has_s = false, has_S = false;
    while (j < p.size() && p[j] != ']') {
      if (p[j] == '\\' && j + 1 < p.size()) {
        has_s |= p[j + 1] == 's';
        has_S |= p[j + 1] == 'S';
        j += 2;
      } else if (p[j] == '[' && j + 1 < p.size() && p[j + 1] == ':') {
        const size_t end = p.find(":]", j + 2);
        j = end == std::string::npos ? p.size() : end + 2;
      } else {
        ++j;
      }
    }
    const std::string cls = p.substr(i, std::min(j + 1, p.size()) - i);
    i = j + 1;
    if (!has_s && !has_S) {
      out += cls;
      continue;
    }
    // U+180E is in Oniguruma's class when exactly one of "negated" and "has \S" holds (it is not \s there).
    const bool member = negated != has_S;
    out += member ? "(?:" + mvs + "|" + cls + ")" : "(?:" + not_space + cls + ")";
  }
  return out;
}

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

// A piece of text on its way through the pre-tokenizers; at_origin: it starts at the input's offset 0
// (tokenizers' offsets_original().0 == 0, which Metaspace's prepend_scheme "first" asks).
struct Word {
  std::string text;
  bool at_origin = false;
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

struct Symbol {
  int64_t id;
  int64_t prev, next;
  size_t len;
};

struct MergeEntry {
  int64_t rank;
  size_t pos;
  int64_t new_id;
  bool operator>(const MergeEntry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

uint64_t pair_key(int64_t a, int64_t b) { return (uint64_t(uint32_t(a)) << 32) | uint64_t(uint32_t(b)); }

// ---- JSON reading with errors naming the file and the path ----

struct Reader {
  std::string source;

  template <typename... Parts>
  [[noreturn]] void error(const std::string& path, const Parts&... parts) const {
    fail("tokenizer", source, ": ", path, parts...);
  }
  const json& field(const json& obj, const std::string& key, const std::string& path) const {
    if (!obj.is_object()) error(path, " is ", io::json_kind(obj), ", expected an object");
    const auto it = obj.find(key);
    if (it == obj.end()) error(path.empty() ? key : path + "." + key, " is missing");
    return *it;
  }
  std::string string_field(const json& obj, const std::string& key, const std::string& path) const {
    const json& v = field(obj, key, path);
    if (!v.is_string()) error(path + "." + key, " is ", io::json_kind(v), ", expected a string");
    return v.get<std::string>();
  }
  bool bool_field(const json& obj, const std::string& key, const std::string& path, bool fallback) const {
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) error(path + "." + key, " is ", io::json_kind(*it), ", expected true or false");
    return it->get<bool>();
  }
  int64_t id_value(const json& v, const std::string& path) const {
    if (!v.is_number_integer()) error(path, " is ", io::json_kind(v), ", expected an integer id");
    const auto id = v.get<int64_t>();
    if (id < 0 || id > int64_t(UINT32_MAX)) error(path, " = ", id, " is out of range (ids are 0..2^32-1)");
    return id;
  }
  std::string type_of(const json& obj, const std::string& path) const {
    if (!obj.is_object()) error(path, " is ", io::json_kind(obj), ", expected an object with a \"type\"");
    return string_field(obj, "type", path);
  }
  const json& array_field(const json& obj, const std::string& key, const std::string& path) const {
    const json& v = field(obj, key, path);
    if (!v.is_array()) error(path + "." + key, " is ", io::json_kind(v), ", expected an array");
    return v;
  }
  [[noreturn]] void unsupported(const std::string& path, const std::string& what) const {
    error(path, " '", what, "' is not supported");
  }
};

}  // namespace

struct HfTokenizer::State {
  std::string source;
  std::vector<NormalizerStep> normalizers;
  std::vector<PreStep> pre_steps;
  // model: BPE (vocab, merges) or Unigram (`unigram`, with `vocab` its token -> id map)
  std::shared_ptr<const UnigramModel> unigram;
  int64_t model_size = 0;  // the model's get_vocab_size()
  std::unordered_map<std::string, int64_t> vocab;
  std::unordered_map<uint64_t, std::pair<int64_t, int64_t>> merges;  // (left, right) -> (rank, merged id)
  bool ignore_merges = false, fuse_unk = false;
  int64_t unk = -1;
  // added tokens
  Matcher raw_tokens, normalized_tokens;
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
  std::vector<Piece> pieces(const std::string& text) const;  // model ids in Piece::id per token
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

namespace {

// tokenizers' AddedVocabulary::find_matches.
void find_matches(const std::string& s, const Matcher& m, std::vector<Piece>& out) {
  if (s.empty()) return;
  size_t start_offset = 0, from = 0, at = 0;
  for (int64_t i; (i = m.find(s, from, at)) >= 0;) {
    const AddedTok& t = m.tokens[size_t(i)];
    size_t start = at, stop = at + t.content.size();
    from = stop;
    if (t.single_word) {
      const bool start_space = start == 0 || !ends_with_word(std::string_view(s).substr(0, start));
      const bool stop_space = stop == s.size() || !starts_with_word(std::string_view(s).substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) start = std::max(space_leftmost_at_end(std::string_view(s).substr(0, start)), start_offset);
    if (t.rstrip) stop += space_rightmost_at_start(std::string_view(s).substr(stop));
    if (start_offset < start) out.push_back({s.substr(start_offset, start - start_offset), -1});
    out.push_back({s.substr(start, stop - start), t.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({s.substr(start_offset), -1});
}

// Applies a Split behavior to the (span, is_match) list covering a piece.
std::vector<std::pair<size_t, size_t>> apply_behavior(const std::vector<std::pair<std::pair<size_t, size_t>, bool>>& m,
                                                      Behavior b) {
  std::vector<std::pair<size_t, size_t>> out;
  bool previous = false;
  switch (b) {
    case Behavior::kIsolated:
      for (const auto& [span, is_match] : m) out.push_back(span);
      break;
    case Behavior::kRemoved:
      for (const auto& [span, is_match] : m)
        if (!is_match) out.push_back(span);
      break;
    case Behavior::kMergedWithPrevious:
      for (const auto& [span, is_match] : m) {
        if (is_match && !previous && !out.empty()) out.back().second = span.second;
        else out.push_back(span);
        previous = is_match;
      }
      break;
    case Behavior::kMergedWithNext: {
      for (auto it = m.rbegin(); it != m.rend(); ++it) {
        if (it->second && !previous && !out.empty()) out.back().first = it->first.first;
        else out.push_back(it->first);
        previous = it->second;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
    case Behavior::kContiguous:
      for (size_t k = 0; k < m.size(); ++k) {
        if (k > 0 && m[k].second == previous) out.back().second = m[k].first.second;
        else out.push_back(m[k].first);
        previous = m[k].second;
      }
      break;
  }
  return out;
}

}  // namespace

std::vector<std::string> HfTokenizer::State::pre_tokenize(const std::string& text, bool at_origin) const {
  std::vector<Word> pieces{{text, at_origin}};
  for (const auto& step : pre_steps) {
    std::vector<Word> next;
    for (auto& word : pieces) {
      std::string& p = word.text;
      // A sub-piece that starts where its piece starts keeps its at_origin.
      auto emit = [&](std::string t, size_t begin) {
        if (!t.empty()) next.push_back({std::move(t), word.at_origin && begin == 0});
      };
      if (step.kind == PreStep::Kind::kWhitespaceSplit) {
        // split(char::is_whitespace, Removed): the runs between whitespace.
        size_t begin = 0;
        for (size_t i = 0; i <= p.size();) {
          char32_t cp = ' ';
          const size_t n = i < p.size() ? utf8_char(p, i, cp) : 1;
          if (is_white_space(cp)) {
            if (i > begin) emit(p.substr(begin, i - begin), begin);
            begin = i + n;
          }
          i += n;
        }
        continue;
      }
      if (step.kind == PreStep::Kind::kMetaspace) {
        std::string s;
        for (char c : p) {
          if (c == ' ') s += step.replacement;
          else s += c;
        }
        const bool starts_with_replacement = s.compare(0, step.replacement.size(), step.replacement) == 0;
        if (!s.empty() && !starts_with_replacement &&
            (step.prepend == Prepend::kAlways || (step.prepend == Prepend::kFirst && word.at_origin)))
          s = step.replacement + s;
        if (!step.split) {
          emit(std::move(s), 0);
          continue;
        }
        // split(replacement, MergedWithNext): each replacement character starts a new piece.
        std::vector<std::pair<std::pair<size_t, size_t>, bool>> m;
        size_t prev = 0;
        for (size_t at = s.find(step.replacement); at != std::string::npos;
             at = s.find(step.replacement, at + step.replacement.size())) {
          if (at > prev) m.push_back({{prev, at}, false});
          m.push_back({{at, at + step.replacement.size()}, true});
          prev = at + step.replacement.size();
        }
        if (prev < s.size()) m.push_back({{prev, s.size()}, false});
        for (const auto& [b, e] : apply_behavior(m, Behavior::kMergedWithNext)) emit(s.substr(b, e - b), b);
        continue;
      }
      if (step.kind == PreStep::Kind::kByteLevel) {
        std::string s = step.add_prefix_space && (p.empty() || p[0] != ' ') ? " " + p : p;
        std::vector<std::string> parts;
        if (step.use_regex) {
          static const Regex gpt2(oniguruma_spaces(kGpt2Pattern));
          for (const auto& [b, e] : gpt2.find_all(s)) parts.push_back(s.substr(b, e - b));
        } else {
          parts.push_back(std::move(s));
        }
        for (size_t k = 0; k < parts.size(); ++k) {
          std::string mapped;
          for (char c : parts[k]) mapped += bytes[static_cast<unsigned char>(c)];
          emit(std::move(mapped), k);
        }
        continue;
      }
      // Split: (span, is_match) pairs covering the piece.
      std::vector<std::pair<size_t, size_t>> found;
      if (step.regex) {
        found = step.regex->find_all(p);
      } else if (!step.literal.empty()) {
        for (size_t at = p.find(step.literal); at != std::string::npos; at = p.find(step.literal, at + step.literal.size()))
          found.emplace_back(at, at + step.literal.size());
      }
      std::vector<std::pair<std::pair<size_t, size_t>, bool>> m;
      size_t prev = 0;
      for (const auto& [b, e] : found) {
        if (b > prev) m.push_back({{prev, b}, step.invert});
        m.push_back({{b, e}, !step.invert});
        prev = e;
      }
      if (prev < p.size()) m.push_back({{prev, p.size()}, step.invert});
      for (const auto& [b, e] : apply_behavior(m, step.behavior))
        if (e > b) emit(p.substr(b, e - b), b);
    }
    pieces = std::move(next);
  }
  std::vector<std::string> out;
  for (auto& w : pieces) out.push_back(std::move(w.text));
  return out;
}

void HfTokenizer::State::bpe(const std::string& word, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges)
    if (auto it = vocab.find(word); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (auto it = cache.find(word); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  // BPE::merge_word: one symbol per character; characters outside the vocabulary become unk (fused when
  // fuse_unk) or, without an unk token, are dropped.
  std::vector<Symbol> symbols;
  int64_t pending_unk_len = -1;
  auto add = [&](int64_t id, size_t len) {
    const int64_t n = int64_t(symbols.size());
    symbols.push_back({id, n - 1, n + 1, len});
  };
  for (size_t i = 0; i < word.size();) {
    const size_t n = utf8_len_at(word, i);
    const auto it = vocab.find(word.substr(i, n));
    if (it != vocab.end()) {
      if (pending_unk_len >= 0) add(unk, size_t(pending_unk_len)), pending_unk_len = -1;
      add(it->second, n);
    } else if (unk >= 0) {
      if (pending_unk_len >= 0 && fuse_unk) {
        pending_unk_len += int64_t(n);
      } else {
        if (pending_unk_len >= 0) add(unk, size_t(pending_unk_len));
        pending_unk_len = int64_t(n);
      }
    }
    i += n;
  }
  if (pending_unk_len >= 0) add(unk, size_t(pending_unk_len));
  if (!symbols.empty()) symbols.back().next = -1;

  // Word::merge_all: lowest rank first (leftmost on ties), stale queue entries skipped.
  std::priority_queue<MergeEntry, std::vector<MergeEntry>, std::greater<MergeEntry>> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i)
    if (auto it = merges.find(pair_key(symbols[i].id, symbols[i + 1].id)); it != merges.end())
      queue.push({it->second.first, i, it->second.second});
  while (!queue.empty()) {
    const MergeEntry top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const size_t next_pos = size_t(cur.next);
    const Symbol right = symbols[next_pos];
    const auto target = merges.find(pair_key(cur.id, right.id));
    if (target == merges.end() || target->second.second != top.new_id) continue;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next > -1 && size_t(right.next) < symbols.size()) symbols[size_t(right.next)].prev = int64_t(top.pos);
    if (cur.prev >= 0) {
      const Symbol& p = symbols[size_t(cur.prev)];
      if (auto it = merges.find(pair_key(p.id, cur.id)); it != merges.end())
        queue.push({it->second.first, size_t(cur.prev), it->second.second});
    }
    if (cur.next >= 0 && size_t(cur.next) < symbols.size()) {
      const Symbol& n = symbols[size_t(cur.next)];
      if (auto it = merges.find(pair_key(cur.id, n.id)); it != merges.end())
        queue.push({it->second.first, top.pos, it->second.second});
    }
  }
  std::vector<int64_t> ids;
  for (const auto& s : symbols)
    if (s.len != 0) ids.push_back(s.id);
  out.insert(out.end(), ids.begin(), ids.end());
  if (word.size() < kCacheMaxLength) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() < kCacheCapacity) cache.emplace(word, std::move(ids));
  }
}

std::vector<Piece> HfTokenizer::State::pieces(const std::string& text) const {
  utf8_decode(text, "text");  // invalid UTF-8 is an error up front
  std::vector<Piece> raw;
  find_matches(text, raw_tokens, raw);
  std::vector<Piece> tokens;
  for (size_t i = 0; i < raw.size(); ++i) {
    Piece& p = raw[i];
    if (p.id >= 0) {
      tokens.push_back(std::move(p));
      continue;
    }
    bool at_origin = i == 0;  // find_matches leaves no empty pieces, so only the first starts at offset 0
    std::vector<Piece> normalized;
    find_matches(normalize(p.text, &at_origin), normalized_tokens, normalized);
    for (size_t k = 0; k < normalized.size(); ++k) {
      Piece& q = normalized[k];
      if (q.id >= 0) {
        tokens.push_back(std::move(q));
        continue;
      }
      std::vector<int64_t> ids;
      for (const auto& word : pre_tokenize(q.text, at_origin && k == 0)) run_model(word, ids);
      for (int64_t id : ids) tokens.push_back({"", id});
    }
  }
  return tokens;
}

namespace {

void read_bpe(const Reader& r, const json& model, HfTokenizer::State& s) {
  const json& vocab = r.field(model, "vocab", "model");
  if (!vocab.is_object()) r.error("model.vocab", " is ", io::json_kind(vocab), ", expected an object");
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab.items()) {
    const int64_t v = r.id_value(id, "model.vocab['" + token + "']");
    s.vocab.emplace(token, v);
    max_id = std::max(max_id, v);
  }
  s.model_size = int64_t(s.vocab.size());
  s.vocab_r.assign(size_t(max_id + 1), std::string());
  for (const auto& [token, id] : s.vocab) s.vocab_r[size_t(id)] = token;
  s.ignore_merges = r.bool_field(model, "ignore_merges", "model", false);
  s.fuse_unk = r.bool_field(model, "fuse_unk", "model", false);
  if (r.bool_field(model, "byte_fallback", "model", false)) r.unsupported("model.byte_fallback", "true");
  if (const auto it = model.find("dropout"); it != model.end() && !it->is_null() &&
                                              !(it->is_number() && it->get<double>() == 0.0))
    r.unsupported("model.dropout", it->dump());
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const auto it = model.find(key); it != model.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      r.unsupported(std::string("model.") + key, it->dump());
  if (const auto it = model.find("unk_token"); it != model.end() && !it->is_null()) {
    if (!it->is_string()) r.error("model.unk_token", " is ", io::json_kind(*it), ", expected a string or null");
    const auto v = s.vocab.find(it->get<std::string>());
    if (v == s.vocab.end()) r.error("model.unk_token", " '", it->get<std::string>(), "' is not in model.vocab");
    s.unk = v->second;
  }
  const json& merges = r.array_field(model, "merges", "model");
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    const std::string path = "model.merges[" + std::to_string(i) + "]";
    std::string a, b;
    if (m.is_string()) {
      const std::string line = m.get<std::string>();
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
        r.error(path, " '", line, "' is not a merge \"left right\" (one space)");
      a = line.substr(0, sp), b = line.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      r.error(path, " is ", m.dump(), ", expected \"left right\" or [\"left\", \"right\"]");
    }
    auto id_of = [&](const std::string& t) {
      const auto it = s.vocab.find(t);
      if (it == s.vocab.end()) r.error(path, ": '", t, "' is not in model.vocab");
      return it->second;
    };
    const int64_t ia = id_of(a), ib = id_of(b), merged = id_of(a + b);
    s.merges.insert_or_assign(pair_key(ia, ib), std::pair{int64_t(i), merged});  // a repeated pair keeps its last rank
  }
}

// model.vocab is [[piece, score], ...]; ids are the positions.
void read_unigram(const Reader& r, const json& model, HfTokenizer::State& s) {
  const json& vocab = r.array_field(model, "vocab", "model");
  std::vector<UnigramModel::Piece> pieces;
  pieces.reserve(vocab.size());
  for (size_t i = 0; i < vocab.size(); ++i) {
    const json& e = vocab[i];
    if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number())
      r.error("model.vocab[" + std::to_string(i) + "]", " is ", e.dump(), ", expected [\"piece\", score]");
    pieces.push_back({e[0].get<std::string>(), e[1].get<double>()});
  }
  std::optional<int64_t> unk;
  if (const auto it = model.find("unk_id"); it != model.end() && !it->is_null()) unk = r.id_value(*it, "model.unk_id");
  const bool byte_fallback = r.bool_field(model, "byte_fallback", "model", false);
  s.vocab_r.clear();
  for (const auto& p : pieces) s.vocab_r.push_back(p.text);
  auto m = std::make_shared<const UnigramModel>(std::move(pieces), unk, byte_fallback, r.source);
  s.vocab.clear();
  for (size_t i = 0; i < m->pieces().size(); ++i) s.vocab.insert_or_assign(m->pieces()[i].text, int64_t(i));
  s.model_size = int64_t(m->pieces().size());
  s.unk = unk.value_or(-1);
  s.unigram = std::move(m);
}

std::shared_ptr<HfTokenizer::State> parse(const json& j, const std::string& source) {
  auto s = std::make_shared<HfTokenizer::State>();
  s->source = source;
  const Reader r{source};
  if (!j.is_object()) r.error("top level", " is ", io::json_kind(j), ", expected an object");

  // ---- model ----
  const json& model = r.field(j, "model", "");
  if (!model.is_object()) r.error("model", " is ", io::json_kind(model), ", expected an object");
  // Without a "type" tokenizers tries each model in turn; a list vocabulary can only be Unigram's.
  std::string type = "BPE";
  if (model.contains("type")) type = r.type_of(model, "model");
  else if (const auto it = model.find("vocab"); it != model.end() && it->is_array()) type = "Unigram";
  if (type == "BPE") read_bpe(r, model, *s);
  else if (type == "Unigram") read_unigram(r, model, *s);
  else r.unsupported("model.type", type);

  // ---- normalizer ----
  std::function<void(const json&, const std::string&)> read_normalizer = [&](const json& n, const std::string& path) {
    if (n.is_null()) return;
    const std::string type = r.type_of(n, path);
    NormalizerStep step;
    if (type == "NFC") {
      step.kind = NormalizerStep::Kind::kNFC;
    } else if (type == "Sequence") {
      const json& list = r.array_field(n, "normalizers", path);
      for (size_t i = 0; i < list.size(); ++i) read_normalizer(list[i], path + ".normalizers[" + std::to_string(i) + "]");
      return;
    } else if (type == "Precompiled") {
      step.kind = NormalizerStep::Kind::kPrecompiled;
      const std::string what = source + ": " + path + ".precompiled_charsmap";
      step.charsmap = std::make_shared<const PrecompiledCharsmap>(
          PrecompiledCharsmap::base64_decode(r.string_field(n, "precompiled_charsmap", path), what), what);
    } else if (type == "Replace") {
      step.kind = NormalizerStep::Kind::kReplace;
      const json& pattern = r.field(n, "pattern", path);
      if (pattern.is_object() && pattern.size() == 1 && pattern.contains("Regex") && pattern["Regex"].is_string()) {
        try {
          step.regex = std::make_shared<const Regex>(oniguruma_spaces(pattern["Regex"].get<std::string>()));
        } catch (const Error& e) {
          r.error(path + ".pattern.Regex", " cannot be compiled: ", e.what());
        }
      } else if (pattern.is_object() && pattern.size() == 1 && pattern.contains("String") && pattern["String"].is_string()) {
        step.literal = pattern["String"].get<std::string>();
      } else {
        r.error(path + ".pattern", " is ", pattern.dump(), ", expected {\"Regex\": \"...\"} or {\"String\": \"...\"}");
      }
      step.content = r.string_field(n, "content", path);
    } else if (type == "Strip") {
      step.kind = NormalizerStep::Kind::kStrip;
      step.strip_left = r.bool_field(n, "strip_left", path, true);
      step.strip_right = r.bool_field(n, "strip_right", path, true);
    } else {
      r.unsupported(path + ".type", type);
    }
    s->normalizers.push_back(std::move(step));
  };
  if (const auto it = j.find("normalizer"); it != j.end()) read_normalizer(*it, "normalizer");

  // ---- pre-tokenizer ----
  std::function<void(const json&, const std::string&)> read_pre = [&](const json& p, const std::string& path) {
    if (p.is_null()) return;
    const std::string type = r.type_of(p, path);
    if (type == "Sequence") {
      const json& list = r.array_field(p, "pretokenizers", path);
      for (size_t i = 0; i < list.size(); ++i) read_pre(list[i], path + ".pretokenizers[" + std::to_string(i) + "]");
    } else if (type == "ByteLevel") {
      PreStep st;
      st.kind = PreStep::Kind::kByteLevel;
      st.add_prefix_space = r.bool_field(p, "add_prefix_space", path, true);
      st.use_regex = r.bool_field(p, "use_regex", path, true);
      r.bool_field(p, "trim_offsets", path, true);  // offsets only
      s->pre_steps.push_back(std::move(st));
    } else if (type == "WhitespaceSplit") {
      PreStep st;
      st.kind = PreStep::Kind::kWhitespaceSplit;
      s->pre_steps.push_back(std::move(st));
    } else if (type == "Metaspace") {
      PreStep st;
      st.kind = PreStep::Kind::kMetaspace;
      st.replacement = r.string_field(p, "replacement", path);
      if (utf8_decode(st.replacement, path + ".replacement").size() != 1)
        r.error(path + ".replacement", " '", st.replacement, "' is not one character");
      const std::string scheme =
          p.contains("prepend_scheme") ? r.string_field(p, "prepend_scheme", path) : std::string("always");
      if (scheme == "always") st.prepend = Prepend::kAlways;
      else if (scheme == "first") st.prepend = Prepend::kFirst;
      else if (scheme == "never") st.prepend = Prepend::kNever;
      else r.error(path + ".prepend_scheme", " is '", scheme, "', expected 'always', 'first' or 'never'");
      // Files from before prepend_scheme say add_prefix_space; false must come with "never" (tokenizers refuses
      // the file otherwise).
      if (!r.bool_field(p, "add_prefix_space", path, true) && st.prepend != Prepend::kNever)
        r.error(path + ".add_prefix_space", " is false but prepend_scheme is '", scheme, "'");
      st.split = r.bool_field(p, "split", path, true);
      s->pre_steps.push_back(std::move(st));
    } else if (type == "Split") {
      PreStep st;
      const json& pattern = r.field(p, "pattern", path);
      if (pattern.is_object() && pattern.size() == 1 && pattern.contains("Regex") && pattern["Regex"].is_string()) {
        const std::string re = pattern["Regex"].get<std::string>();
        try {
          st.regex = std::make_shared<const Regex>(oniguruma_spaces(re));
        } catch (const Error& e) {
          r.error(path + ".pattern.Regex", " cannot be compiled: ", e.what());
        }
      } else if (pattern.is_object() && pattern.size() == 1 && pattern.contains("String") && pattern["String"].is_string()) {
        st.literal = pattern["String"].get<std::string>();
      } else {
        r.error(path + ".pattern", " is ", pattern.dump(), ", expected {\"Regex\": \"...\"} or {\"String\": \"...\"}");
      }
      const std::string behavior = r.string_field(p, "behavior", path);
      static const std::pair<const char*, Behavior> kBehaviors[] = {
          {"Removed", Behavior::kRemoved},
          {"Isolated", Behavior::kIsolated},
          {"MergedWithPrevious", Behavior::kMergedWithPrevious},
          {"MergedWithNext", Behavior::kMergedWithNext},
          {"Contiguous", Behavior::kContiguous}};
      bool known = false;
      for (const auto& [name, b] : kBehaviors)
        if (behavior == name) st.behavior = b, known = true;
      if (!known) r.unsupported(path + ".behavior", behavior);
      st.invert = r.bool_field(p, "invert", path, false);
      s->pre_steps.push_back(std::move(st));
    } else {
      r.unsupported(path + ".type", type);
    }
  };
  if (const auto it = j.find("pre_tokenizer"); it != j.end()) read_pre(*it, "pre_tokenizer");

  // ---- added tokens (ids as tokenizers assigns them: the vocabulary's id, else the next free one) ----
  if (const auto it = j.find("added_tokens"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) r.error("added_tokens", " is ", io::json_kind(*it), ", expected an array");
    int64_t next_id = -1;  // AddedVocabulary::add_tokens
    const int64_t model_size = s->model_size;
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      const std::string path = "added_tokens[" + std::to_string(i) + "]";
      AddedTok a;
      a.content = r.string_field(t, "content", path);
      const int64_t declared = r.id_value(r.field(t, "id", path), path + ".id");
      a.special = r.bool_field(t, "special", path, false);
      a.normalized = r.bool_field(t, "normalized", path, !a.special);
      a.lstrip = r.bool_field(t, "lstrip", path, false);
      a.rstrip = r.bool_field(t, "rstrip", path, false);
      a.single_word = r.bool_field(t, "single_word", path, false);
      if (a.content.empty()) continue;
      if (next_id < 0) {
        int64_t max_added = -1;
        for (const auto& [c, id] : s->added_ids) max_added = std::max(max_added, id);
        next_id = max_added < 0 ? model_size : (max_added >= model_size || model_size == 0 ? max_added + 1 : model_size);
      }
      int64_t id;
      if (auto f = s->added_ids.find(a.content); f != s->added_ids.end()) id = f->second;
      else if (auto v = s->vocab.find(a.content); v != s->vocab.end()) id = v->second;
      else id = next_id++;
      if (id != declared)
        r.error(path + ".id", " is ", declared, " but the tokenizers library gives '", a.content, "' id ", id,
                " (the vocabulary's id, else the next id after the vocabulary and the earlier added tokens)");
      a.id = id;
      s->added_ids.insert_or_assign(a.content, id);
      s->added_text.insert_or_assign(id, a.content);
      if (a.normalized) {
        a.content = s->normalize(a.content);
        if (a.content.empty()) continue;
        s->normalized_tokens.tokens.push_back(std::move(a));
      } else {
        s->raw_tokens.tokens.push_back(std::move(a));
      }
    }
  }
  s->raw_tokens.build();
  s->normalized_tokens.build();

  // ---- post-processor ----
  std::function<void(const json&, const std::string&)> read_post = [&](const json& p, const std::string& path) {
    if (p.is_null()) return;
    const std::string type = r.type_of(p, path);
    if (type == "ByteLevel") return;  // offsets only
    if (type == "Sequence") {
      const json& list = r.array_field(p, "processors", path);
      for (size_t i = 0; i < list.size(); ++i) read_post(list[i], path + ".processors[" + std::to_string(i) + "]");
      return;
    }
    if (type != "TemplateProcessing") r.unsupported(path + ".type", type);
    const json& specials = r.field(p, "special_tokens", path);
    if (!specials.is_object())
      r.error(path + ".special_tokens", " is ", io::json_kind(specials), ", expected an object");
    const json& single = r.array_field(p, "single", path);
    std::vector<std::optional<std::vector<int64_t>>> tmpl;
    for (size_t i = 0; i < single.size(); ++i) {
      const json& e = single[i];
      const std::string epath = path + ".single[" + std::to_string(i) + "]";
      if (e.is_object() && e.size() == 1 && e.contains("Sequence")) {
        const std::string seq = r.string_field(e["Sequence"], "id", epath + ".Sequence");
        if (seq != "A") r.error(epath + ".Sequence.id", " is '", seq, "', expected 'A' in a single template");
        tmpl.emplace_back(std::nullopt);
      } else if (e.is_object() && e.size() == 1 && e.contains("SpecialToken")) {
        const std::string name = r.string_field(e["SpecialToken"], "id", epath + ".SpecialToken");
        const std::string spath = path + ".special_tokens['" + name + "']";
        if (!specials.contains(name)) r.error(spath, " is missing (used by ", epath, ")");
        const json& ids = r.array_field(specials[name], "ids", spath);
        std::vector<int64_t> v;
        for (size_t k = 0; k < ids.size(); ++k) v.push_back(r.id_value(ids[k], spath + ".ids[" + std::to_string(k) + "]"));
        tmpl.emplace_back(std::move(v));
      } else {
        r.error(epath, " is ", e.dump(), ", expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
      }
    }
    s->templates.push_back(std::move(tmpl));
  };
  if (const auto it = j.find("post_processor"); it != j.end()) read_post(*it, "post_processor");
  return s;
}

}  // namespace

HfTokenizer HfTokenizer::from_json(const json& j, const std::string& source) { return HfTokenizer(parse(j, source)); }

HfTokenizer HfTokenizer::from_file(const fs::path& path) {
  return from_json(read_json(path, "tokenizer.json"), path.string());
}

HfTokenizer HfTokenizer::from_pretrained(const fs::path& dir) {
  check_folder(dir, "tokenizer");
  return from_file(dir / "tokenizer.json");
}

std::vector<std::string> HfTokenizer::tokenize(const std::string& text) const {
  std::vector<std::string> out;
  for (const auto& p : s_->pieces(text)) {
    if (auto it = s_->added_text.find(p.id); it != s_->added_text.end()) out.push_back(it->second);
    else out.push_back(size_t(p.id) < s_->vocab_r.size() ? s_->vocab_r[size_t(p.id)] : std::string());
  }
  return out;
}

std::vector<int64_t> HfTokenizer::encode(const std::string& text, bool add_special_tokens) const {
  std::vector<int64_t> ids;
  for (const auto& p : s_->pieces(text)) ids.push_back(p.id);
  return add_special_tokens ? s_->apply_templates(std::move(ids)) : ids;
}

HfTokenizer::Padded HfTokenizer::encode_padded(const std::string& text, int64_t max_length, int64_t pad_id,
                                               bool add_special_tokens) const {
  const int64_t n_special = add_special_tokens ? s_->n_special() : 0;
  KILN_CHECK(max_length >= n_special && max_length > 0, "tokenizer", s_->source, ": max_length ", max_length,
             " leaves no room for text tokens next to the ", n_special, " special tokens");
  std::vector<int64_t> ids = encode(text, false);
  if (int64_t(ids.size()) > max_length - n_special) ids.resize(size_t(max_length - n_special));
  if (add_special_tokens) ids = s_->apply_templates(std::move(ids));
  Padded p;
  p.attention_mask.assign(ids.size(), 1);
  p.attention_mask.resize(size_t(max_length), 0);
  ids.resize(size_t(max_length), pad_id);
  p.ids = std::move(ids);
  return p;
}

std::optional<int64_t> HfTokenizer::id_of(const std::string& token) const {
  if (auto it = s_->added_ids.find(token); it != s_->added_ids.end()) return it->second;
  if (auto it = s_->vocab.find(token); it != s_->vocab.end()) return it->second;
  return std::nullopt;
}

int64_t HfTokenizer::vocab_size() const {
  int64_t n = s_->model_size;
  for (const auto& [content, id] : s_->added_ids)
    if (!s_->vocab.count(content)) ++n;
  return n;
}

int64_t HfTokenizer::num_special_tokens_to_add() const { return s_->n_special(); }

}  // namespace kiln::tokenizers
