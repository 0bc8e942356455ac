#include "tokenizers/tokenizer_files.h"

#include "core/error.h"
#include "io/input_file.h"
#include "io/json_config.h"
#include "tokenizers/unicode_text.h"

namespace kiln::tokenizers {
namespace fs = std::filesystem;

std::string read_file(const fs::path& path, const std::string& what) {
  std::error_code ec;
  KILN_CHECK(fs::exists(path, ec), "tokenizer", path.string(), ": ", what, " not found");
  // A FIFO, socket, device or folder is refused without a blocking open (io/input_file.h).
  return io::read_input_file("tokenizer", path, "a regular file (the " + what + ")");
}

nlohmann::json read_json(const fs::path& path, const std::string& what) {
  const std::string s = read_file(path, what);
  return io::parse_json(s.data(), s.data() + s.size(), "tokenizer", path.string());
}

void check_folder(const fs::path& dir, const std::string& what) {
  std::error_code ec;
  KILN_CHECK(fs::is_directory(dir, ec), "tokenizer", what, " folder '", dir.string(),
             "' does not exist or is not a directory");
}

TokenizerConfig TokenizerConfig::load(const fs::path& dir) {
  TokenizerConfig c;
  c.dir = dir;
  std::error_code ec;
  for (auto [name, target] : {std::pair{"tokenizer_config.json", &c.config},
                              std::pair{"special_tokens_map.json", &c.special_map}}) {
    if (!fs::exists(dir / name, ec)) continue;
    *target = read_json(dir / name, name);
    KILN_CHECK(target->is_object(), "tokenizer", (dir / name).string(), ": top level is ", io::json_kind(*target),
               ", expected an object");
  }
  return c;
}

namespace {
// A token given as "text" or as an AddedToken dict {"content": "text", ...}.
std::optional<std::string> token_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}
}  // namespace

std::optional<std::string> TokenizerConfig::special_token(const std::string& key) const {
  for (const auto* j : {&special_map, &config}) {
    if (j->contains(key) && !(*j)[key].is_null()) {
      auto t = token_text((*j)[key]);
      KILN_CHECK(t.has_value(), "tokenizer", (dir / (j == &config ? "tokenizer_config.json" : "special_tokens_map.json")).string(),
                 ": '", key, "' is ", io::json_kind((*j)[key]), ", expected a string or {\"content\": ...}");
      return t;
    }
  }
  return std::nullopt;
}

std::optional<std::string> TokenizerConfig::special_token(const std::string& key,
                                                          std::optional<std::string> fallback) const {
  if (auto t = special_token(key)) return t;
  for (const auto* j : {&special_map, &config})
    if (j->contains(key)) return std::nullopt;  // explicitly null
  return fallback;
}

std::vector<AddedToken> TokenizerConfig::added_tokens() const {
  std::vector<AddedToken> out;
  const auto where = (dir / "tokenizer_config.json").string();
  if (config.contains("added_tokens_decoder") && config["added_tokens_decoder"].is_object()) {
    for (const auto& [key, v] : config["added_tokens_decoder"].items()) {
      AddedToken t;
      try {
        t.id = std::stoll(key);
      } catch (const std::exception&) {
        fail("tokenizer", where, ": added_tokens_decoder key '", key, "' is not an integer id");
      }
      const auto content = token_text(v);
      KILN_CHECK(content.has_value(), "tokenizer", where, ": added_tokens_decoder[", key, "] has no \"content\"");
      t.content = *content;
      t.lstrip = json_flag(v, "lstrip");
      t.rstrip = json_flag(v, "rstrip");
      out.push_back(std::move(t));
    }
    return out;
  }
  std::error_code ec;
  if (fs::exists(dir / "added_tokens.json", ec)) {
    const auto j = read_json(dir / "added_tokens.json", "added_tokens.json");
    KILN_CHECK(j.is_object(), "tokenizer", (dir / "added_tokens.json").string(), ": expected an object");
    for (const auto& [content, id] : j.items()) {
      KILN_CHECK(id.is_number_integer(), "tokenizer", (dir / "added_tokens.json").string(), ": id of '", content,
                 "' is ", io::json_kind(id), ", expected an integer");
      out.push_back({content, id.get<int64_t>()});
    }
  }
  return out;
}

int64_t TokenizerConfig::model_max_length(int64_t fallback) const {
  const auto it = config.find("model_max_length");
  if (it == config.end() || !it->is_number()) return fallback;
  const double v = it->get<double>();
  // transformers writes 1e30 ("no limit") when the model has none.
  return v >= 1 && v < 1e9 ? static_cast<int64_t>(v) : fallback;
}

bool TokenizerConfig::flag(const std::string& key, bool fallback) const {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  KILN_CHECK(it->is_boolean(), "tokenizer", (dir / "tokenizer_config.json").string(), ": ", key, " is ",
             io::json_kind(*it), ", expected true or false");
  return it->get<bool>();
}

bool json_flag(const nlohmann::json& obj, const std::string& key, bool fallback) {
  if (!obj.is_object()) return fallback;
  const auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

std::string json_string(const nlohmann::json& obj, const std::string& key, const std::string& fallback) {
  if (!obj.is_object()) return fallback;
  const auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : fallback;
}

std::string lstrip(std::string_view text) {
  const auto u = utf8_decode(text, "text");
  size_t i = 0;
  while (i < u.size() && python_isspace(u[i])) ++i;
  return utf8_encode(std::u32string_view(u).substr(i));
}

std::string rstrip(std::string_view text) {
  const auto u = utf8_decode(text, "text");
  size_t n = u.size();
  while (n > 0 && python_isspace(u[n - 1])) --n;
  return utf8_encode(std::u32string_view(u).substr(0, n));
}

std::vector<Segment> split_on_added_tokens(std::string_view text, const std::vector<AddedToken>& tokens) {
  // Trie.split: at the first position where any token matches, cut the longest one there.
  std::vector<Segment> parts;
  std::vector<const AddedToken*> part_token;  // the added token of each part, or nullptr
  size_t start = 0, pos = 0;
  while (pos < text.size()) {
    const AddedToken* best = nullptr;
    for (const auto& t : tokens)
      if (!t.content.empty() && text.compare(pos, t.content.size(), t.content) == 0 &&
          (best == nullptr || t.content.size() > best->content.size()))
        best = &t;
    if (best == nullptr) {
      ++pos;
      continue;
    }
    if (pos > start) {
      parts.push_back({std::string(text.substr(start, pos - start))});
      part_token.push_back(nullptr);
    }
    parts.push_back({best->content, best->id});
    part_token.push_back(best);
    pos += best->content.size();
    start = pos;
  }
  if (start < text.size()) {
    parts.push_back({std::string(text.substr(start))});
    part_token.push_back(nullptr);
  }
  // Whitespace swallowing, in the order transformers applies it (token by token, left to right).
  for (size_t i = 0; i < parts.size(); ++i) {
    const AddedToken* t = part_token[i];
    if (t == nullptr) continue;
    if (t->rstrip && i + 1 < parts.size() && !parts[i + 1].text.empty()) parts[i + 1].text = lstrip(parts[i + 1].text);
    if (t->lstrip && i > 0 && !parts[i - 1].text.empty()) parts[i - 1].text = rstrip(parts[i - 1].text);
  }
  std::vector<Segment> out;
  for (auto& p : parts)
    if (!p.text.empty()) out.push_back(std::move(p));
  return out;
}

}  // namespace kiln::tokenizers
