#include "tokenizers/clip_tokenizer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <climits>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "io/json_config.h"
#include "tokenizers/regex.h"
#include "tokenizers/tokenizer_files.h"
#include "tokenizers/unicode_text.h"

namespace kiln::tokenizers {
namespace fs = std::filesystem;

namespace {
// The slow CLIPTokenizer reads at most this many merges (49152 - 256 - 2).
constexpr size_t kMaxMerges = 48894;
// CLIPTokenizer seeds its BPE cache with these, so they map to themselves, without "</w>".
constexpr const char* kCachedSpecials[] = {"<|startoftext|>", "<|endoftext|>"};

// Python's `regex` module with IGNORECASE treats U+0345 (which case-folds to the letter iota) as
// outside [^\s\p{L}\p{N}] yet not a letter either, so no alternative matches it and it is dropped;
// PCRE2 needs to be told.
const Regex& pretokenize_regex() {
  static const Regex re(
      R"(<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}\x{345}]+)",
      /*caseless=*/true);
  return re;
}
// BasicTokenizer._clean_text: control characters (category C* except \t \n \r), U+0000 and
// U+FFFD go; \t \n \r and the Zs spaces become " ".
const Regex& dropped_chars() {
  static const Regex re(R"((?![\t\n\r])[\p{C}\x{FFFD}])");
  return re;
}
const Regex& space_chars() {
  static const Regex re(R"([\t\n\r\p{Zs}])");
  return re;
}

std::vector<std::string> split_ascii_ws(std::string_view line) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    size_t j = i;
    while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j]))) ++j;
    if (j > i) parts.emplace_back(line.substr(i, j - i));
    i = j;
  }
  return parts;
}

struct ClipState : PretrainedTokenizer::State {
  std::unordered_map<std::string, int64_t> vocab;
  std::unordered_map<std::string, int64_t> ranks;  // "left right" -> merge rank
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int64_t> added_ids;
  std::array<std::string, 256> bytes = byte_encoder();

  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<std::string>> cache;

  void add_merge(const std::string& left, const std::string& right, int64_t rank) {
    ranks.insert_or_assign(left + " " + right, rank);  // a repeated merge keeps its last rank, like dict()
  }
  int64_t token_id(const std::string& token) const {
    if (auto it = added_ids.find(token); it != added_ids.end()) return it->second;
    if (auto it = vocab.find(token); it != vocab.end()) return it->second;
    return *unk;
  }
  std::vector<std::string> bpe(const std::string& token) const;
  std::vector<std::string> pretokenize(const std::string& text) const;

  std::vector<std::string> tokenize(const std::string& text) const override;
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const override;
  int64_t vocab_size() const override;
};

void read_vocab(ClipState& s, const nlohmann::json& v, const std::string& where) {
  KILN_CHECK(v.is_object(), "tokenizer", where, ": vocabulary is ", io::json_kind(v), ", expected an object");
  for (const auto& [token, id] : v.items()) {
    KILN_CHECK(id.is_number_integer(), "tokenizer", where, ": id of token '", token, "' is ", io::json_kind(id),
               ", expected an integer");
    s.vocab.emplace(token, id.get<int64_t>());
  }
  KILN_CHECK(!s.vocab.empty(), "tokenizer", where, ": the vocabulary is empty");
}

void read_merges_txt(ClipState& s, const fs::path& path) {
  const std::string text = read_file(path, "CLIP merges file");
  // Python: read().strip().split("\n")[1 : 48894 + 1] -- the first line (the "#version" header) is skipped.
  size_t begin = text.find_first_not_of(" \t\r\n\v\f"), end = text.find_last_not_of(" \t\r\n\v\f");
  if (begin == std::string::npos) fail("tokenizer", path.string(), ": the merges file is empty");
  std::string_view body(text.data() + begin, end - begin + 1);
  size_t line_no = 0, pos = 0;
  while (pos <= body.size()) {
    const size_t nl = std::min(body.find('\n', pos), body.size());
    const std::string_view line = body.substr(pos, nl - pos);
    pos = nl + 1;
    if (line_no++ == 0) continue;
    if (line_no - 1 > kMaxMerges) break;
    const auto parts = split_ascii_ws(line);
    if (parts.empty()) continue;
    KILN_CHECK(parts.size() == 2, "tokenizer", path.string(), ": line ", line_no, " is not a merge 'left right': '",
               std::string(line), "'");
    s.add_merge(parts[0], parts[1], int64_t(line_no) - 2);
  }
}

void read_tokenizer_json(ClipState& s, const fs::path& path) {
  const auto j = read_json(path, "tokenizer.json");
  const auto where = path.string();
  KILN_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(), "tokenizer", where,
             ": no \"model\" object");
  const auto& model = j["model"];
  KILN_CHECK(model.contains("vocab") && model.contains("merges"), "tokenizer", where,
             ": model has no \"vocab\" / \"merges\" (not a BPE tokenizer?)");
  read_vocab(s, model["vocab"], where + " (model.vocab)");
  KILN_CHECK(model["merges"].is_array(), "tokenizer", where, ": model.merges is ", io::json_kind(model["merges"]),
             ", expected an array");
  int64_t rank = 0;
  for (const auto& m : model["merges"]) {
    std::vector<std::string> parts;
    if (m.is_string()) parts = split_ascii_ws(m.get<std::string>());
    else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
      parts = {m[0].get<std::string>(), m[1].get<std::string>()};
    KILN_CHECK(parts.size() == 2, "tokenizer", where, ": model.merges[", rank, "] is not a pair: ", m.dump());
    s.add_merge(parts[0], parts[1], rank++);
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& t : j["added_tokens"])
      if (t.is_object() && t.contains("content") && t.contains("id") && t["id"].is_number_integer())
        s.added.push_back({json_string(t, "content", ""), t["id"].get<int64_t>(), json_flag(t, "lstrip"),
                           json_flag(t, "rstrip")});
}
}  // namespace

ClipTokenizer ClipTokenizer::from_pretrained(const fs::path& dir) {
  const auto config = open_folder(dir, "CLIP tokenizer");
  auto s = std::make_shared<ClipState>();
  s->dir = dir;
  std::error_code ec;
  if (fs::exists(dir / "vocab.json", ec) || fs::exists(dir / "merges.txt", ec)) {
    read_vocab(*s, read_json(dir / "vocab.json", "CLIP vocabulary (vocab.json)"), (dir / "vocab.json").string());
    read_merges_txt(*s, dir / "merges.txt");
    s->added = config.added_tokens();
  } else if (fs::exists(dir / "tokenizer.json", ec)) {
    read_tokenizer_json(*s, dir / "tokenizer.json");
    for (auto& t : config.added_tokens()) s->added.push_back(std::move(t));
  } else {
    fail("tokenizer", dir.string(), ": no vocab.json + merges.txt (or tokenizer.json) for the CLIP BPE tokenizer");
  }
  for (const auto& t : s->added) s->added_ids.insert_or_assign(t.content, t.id);

  // Special tokens: the CLIPTokenizer defaults unless the folder names others.
  auto special = [&](const char* key, const char* fallback) {
    const std::string text = config.special_token(key).value_or(fallback);
    int64_t id = -1;
    if (auto it = s->added_ids.find(text); it != s->added_ids.end()) id = it->second;
    else if (auto it = s->vocab.find(text); it != s->vocab.end()) id = it->second;
    KILN_CHECK(id >= 0, "tokenizer", dir.string(), ": ", key, " '", text, "' is not in the vocabulary");
    if (!s->added_ids.count(text)) {  // special tokens are never split, like added tokens
      s->added.push_back({text, id});
      s->added_ids.emplace(text, id);
    }
    return id;
  };
  s->bos = special("bos_token", "<|startoftext|>");
  s->eos = special("eos_token", "<|endoftext|>");
  s->unk = special("unk_token", "<|endoftext|>");
  s->pad = special("pad_token", "<|endoftext|>");
  s->max_length = config.model_max_length(77);
  return ClipTokenizer(std::move(s));
}

std::vector<std::string> ClipState::pretokenize(const std::string& text) const {
  // BasicTokenizer(strip_accents=False, do_split_on_punc=False).tokenize, then " ".join.
  const std::string cleaned = space_chars().replace_all(dropped_chars().replace_all(text, ""), " ");
  std::u32string spaced;
  for (char32_t cp : utf8_decode(cleaned, "prompt")) {
    if (is_cjk_ideograph(cp)) {
      spaced.push_back(U' ');
      spaced.push_back(cp);
      spaced.push_back(U' ');
    } else {
      spaced.push_back(cp);
    }
  }
  const std::u32string normalized = nfc(spaced);
  std::u32string joined;
  for (size_t i = 0; i < normalized.size();) {
    while (i < normalized.size() && python_isspace(normalized[i])) ++i;
    size_t j = i;
    while (j < normalized.size() && !python_isspace(normalized[j])) ++j;
    if (j > i) {
      if (!joined.empty()) joined.push_back(U' ');
      joined += python_lower(std::u32string_view(normalized).substr(i, j - i));
    }
    i = j;
  }
  const std::string utf8 = utf8_encode(joined);
  std::vector<std::string> pieces;
  for (const auto& [b, e] : pretokenize_regex().find_all(utf8)) {
    std::string mapped;
    for (size_t k = b; k < e; ++k) mapped += bytes[static_cast<unsigned char>(utf8[k])];
    pieces.push_back(std::move(mapped));
  }
  return pieces;
}

std::vector<std::string> ClipState::bpe(const std::string& token) const {
  for (const char* special : kCachedSpecials)
    if (token == special) return {token};
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (auto it = cache.find(token); it != cache.end()) return it->second;
  }
  // Symbols: the characters of the (byte-mapped) piece, "</w>" appended to the last one.
  std::vector<std::string> word;
  for (size_t i = 0; i < token.size();) {
    size_t n = 1;
    while (i + n < token.size() && (static_cast<unsigned char>(token[i + n]) & 0xC0) == 0x80) ++n;
    word.emplace_back(token.substr(i, n));
    i += n;
  }
  word.back() += "</w>";
  // Merge the lowest-ranked adjacent pair everywhere (left to right) until none is mergeable.
  while (word.size() > 1) {
    int64_t best = INT64_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const auto it = ranks.find(word[i] + " " + word[i + 1]);
      if (it != ranks.end() && it->second < best) best = it->second, at = i;
    }
    if (best == INT64_MAX) break;
    const std::string first = word[at], second = word[at + 1];
    std::vector<std::string> merged;
    merged.reserve(word.size());
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(word[i++]);
      }
    }
    word = std::move(merged);
  }
  std::lock_guard<std::mutex> lock(cache_mutex);
  cache.emplace(token, word);
  return word;
}

std::vector<std::string> ClipState::tokenize(const std::string& text) const {
  utf8_decode(text, "prompt");  // reject invalid UTF-8 up front, with a clear message
  std::vector<std::string> tokens;
  for (const auto& seg : split_on_added_tokens(text, added)) {
    if (seg.id >= 0) {
      tokens.push_back(seg.text);
      continue;
    }
    for (const auto& piece : pretokenize(seg.text))
      for (auto& sym : bpe(piece)) tokens.push_back(std::move(sym));
  }
  return tokens;
}

std::vector<int64_t> ClipState::encode(const std::string& text, bool add_special_tokens) const {
  std::vector<int64_t> ids;
  if (add_special_tokens) ids.push_back(*bos);
  for (const auto& t : tokenize(text)) ids.push_back(token_id(t));
  if (add_special_tokens) ids.push_back(*eos);
  return ids;
}

int64_t ClipState::vocab_size() const {
  int64_t n = int64_t(vocab.size());
  for (const auto& t : added)
    if (!vocab.count(t.content)) ++n;
  return n;
}

std::vector<int64_t> ClipTokenizer::encode_padded(const std::string& text, int64_t max_length) const {
  if (max_length < 0) max_length = model_max_length();
  std::vector<int64_t> ids = encode(text);
  if (int64_t(ids.size()) > max_length) {
    // transformers cannot truncate when bos + eos alone fill max_length; refuse instead.
    KILN_CHECK(max_length > 2, "tokenizer", "CLIP max_length ", max_length, " leaves no room for text tokens");
    ids.resize(size_t(max_length - 1));
    ids.push_back(eos_id());
  }
  ids.resize(size_t(max_length), pad_id());
  return ids;
}

}  // namespace kiln::tokenizers
