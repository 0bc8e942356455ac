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
#include "tokenizers/hf_tokenizer_state.h"
#include "tokenizers/tokenizer_files.h"
#include "tokenizers/unicode_text.h"

namespace kiln::tokenizers {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace hf;

namespace {

// The pattern of tokenizers' ByteLevel pre-tokenizer with use_regex (GPT-2's).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// The BPE cache keeps words shorter than this many bytes, at most kCacheCapacity of them (as tokenizers).
constexpr size_t kCacheMaxLength = 256;
constexpr size_t kCacheCapacity = 10000;

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

// A piece of text on its way through the pre-tokenizers; at_origin: it starts at the input's offset 0
// (tokenizers' offsets_original().0 == 0, which Metaspace's prepend_scheme "first" asks).
struct Word {
  std::string text;
  bool at_origin = false;
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

}  // namespace

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

HfTokenizer HfTokenizer::from_json(const json& j, const std::string& source) { return HfTokenizer(parse_tokenizer_json(j, source)); }

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
