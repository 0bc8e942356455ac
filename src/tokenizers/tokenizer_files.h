// What the CLIP and T5 tokenizers share: reading a Hugging Face tokenizer folder's files with
// "[tokenizer] <file>: ..." errors, the special-token settings, and splitting text on added
// tokens the way transformers' slow tokenizers do before running the model's own tokenizer.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::tokenizers {

// The whole file; a missing or unreadable file is an error naming it and `what` it is for.
std::string read_file(const std::filesystem::path& path, const std::string& what);
// Parsed JSON of `path`; errors name the file (and line/column of bad JSON).
nlohmann::json read_json(const std::filesystem::path& path, const std::string& what);
// The folder must exist and be a directory.
void check_folder(const std::filesystem::path& dir, const std::string& what);

// A token matched verbatim in the text before the model runs (special tokens, <extra_id_k>).
// lstrip/rstrip: the token also swallows the whitespace on its left/right.
struct AddedToken {
  std::string content;
  int64_t id = -1;
  bool lstrip = false, rstrip = false;
};

// tokenizer_config.json and special_tokens_map.json of a folder (each optional).
struct TokenizerConfig {
  nlohmann::json config = nlohmann::json::object();       // tokenizer_config.json
  nlohmann::json special_map = nlohmann::json::object();  // special_tokens_map.json
  std::filesystem::path dir;

  static TokenizerConfig load(const std::filesystem::path& dir);
  // A special token's text ("bos_token", ...): special_tokens_map.json wins over
  // tokenizer_config.json, as in transformers; a value may be a string or {"content": ...}.
  std::optional<std::string> special_token(const std::string& key) const;
  // As special_token(key), but `fallback` (the tokenizer class's default) when neither file has
  // the key; a key set to null still gives nullopt.
  std::optional<std::string> special_token(const std::string& key, std::optional<std::string> fallback) const;
  // tokenizer_config.json's "added_tokens_decoder" (id -> token), else added_tokens.json.
  std::vector<AddedToken> added_tokens() const;
  // tokenizer_config.json's model_max_length, or `fallback` when absent or not a sane integer.
  int64_t model_max_length(int64_t fallback) const;
  // A boolean setting of tokenizer_config.json: absent or null gives `fallback`, anything but a
  // bool is an error naming the file and key.
  bool flag(const std::string& key, bool fallback) const;
};

// One piece of text after splitting on added tokens: either plain text (id < 0) or a token.
struct Segment {
  std::string text;
  int64_t id = -1;
};

// transformers' PreTrainedTokenizer.tokenize split: the leftmost-longest occurrence of any added
// token is cut out, lstrip/rstrip tokens strip the whitespace (str.isspace) of their neighbours,
// and empty text segments are dropped.
std::vector<Segment> split_on_added_tokens(std::string_view text, const std::vector<AddedToken>& tokens);

// obj[key] when it is a boolean, else `fallback` (lenient reading of optional flags).
bool json_flag(const nlohmann::json& obj, const std::string& key, bool fallback = false);
// obj[key] when it is a string, else `fallback`.
std::string json_string(const nlohmann::json& obj, const std::string& key, const std::string& fallback);

// Python's str.strip family on UTF-8 text (whitespace as str.isspace).
std::string lstrip(std::string_view text);
std::string rstrip(std::string_view text);

}  // namespace kiln::tokenizers
