#include "tokenizers/t5_tokenizer.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "tokenizers/hf_tokenizer.h"
#include "tokenizers/sentencepiece_slow.h"
#include "tokenizers/tokenizer_files.h"

namespace kiln::tokenizers {
namespace fs = std::filesystem;

struct T5Tokenizer::State {
  fs::path dir;
  std::optional<SlowSentencePiece> sp;
  std::optional<HfTokenizer> fast;  // a folder with tokenizer.json but no spiece.model
  int64_t eos = -1, pad = -1, unk = -1, max_length = 512;
};

T5Tokenizer T5Tokenizer::from_pretrained(const fs::path& dir) {
  check_folder(dir, "T5 tokenizer");
  auto s = std::make_shared<State>();
  s->dir = dir;
  const auto config = TokenizerConfig::load(dir);
  const fs::path model_path = dir / "spiece.model";
  std::error_code ec;
  if (!fs::exists(model_path, ec) && fs::exists(dir / "tokenizer.json", ec)) {
    // Only tokenizer.json (as some FLUX.1 / SD3 re-uploads have it): what transformers' T5TokenizerFast gives,
    // through kiln's tokenizer.json reader. Its added tokens are the file's; </s> is appended as T5TokenizerFast's
    // TemplateProcessing does, without the slow tokenizer's "no second </s>" rule.
    s->fast = HfTokenizer::from_pretrained(dir);
    auto special = [&](const char* key, const char* fallback) {
      const std::string text = config.special_token(key).value_or(fallback);
      const auto id = s->fast->id_of(text);
      KILN_CHECK(id.has_value(), "tokenizer", (dir / "tokenizer.json").string(), ": ", key, " '", text,
                 "' is neither an added token nor in the vocabulary");
      return *id;
    };
    s->eos = special("eos_token", "</s>");
    s->unk = special("unk_token", "<unk>");
    s->pad = special("pad_token", "<pad>");
    s->max_length = config.model_max_length(512);
    return T5Tokenizer(std::move(s));
  }
  // legacy only matters to the slow T5Tokenizer; T5TokenizerFast reads tokenizer.json, which
  // behaves like the legacy path.
  const bool slow_class = json_string(config.config, "tokenizer_class", "T5Tokenizer") == "T5Tokenizer";
  const bool legacy = !slow_class || json_flag(config.config, "legacy", true);
  s->sp.emplace(model_path, "SentencePiece model (spiece.model)", legacy,
                json_flag(config.config, "add_prefix_space", true));
  SlowSentencePiece& sp = *s->sp;
  const int64_t n_pieces = sp.piece_size();

  for (auto& t : config.added_tokens()) sp.add_token(std::move(t));
  if (sp.added_tokens().empty()) {
    // No added-token list: T5Tokenizer's defaults, <extra_id_k> = n_pieces - 1 + extra_ids - k.
    const auto it = config.config.find("extra_ids");
    const int64_t extra = it != config.config.end() && it->is_number_integer() ? it->get<int64_t>() : 100;
    for (int64_t k = 0; k < extra; ++k)
      sp.add_token({"<extra_id_" + std::to_string(k) + ">", n_pieces - 1 + extra - k, true, true});
  }
  for (const auto& t : sp.added_tokens())
    if (t.content.compare(0, 10, "<extra_id_") == 0) sp.mark_special(t.content);
  if (const auto it = config.config.find("additional_special_tokens"); it != config.config.end() && it->is_array())
    for (const auto& t : *it)
      if (t.is_string()) sp.mark_special(t.get<std::string>());

  auto special = [&](const char* key, const char* fallback) {
    const std::string text = config.special_token(key).value_or(fallback);
    const auto id = sp.add_special_token(text);  // special tokens are never split
    KILN_CHECK(id.has_value(), "tokenizer", dir.string(), ": ", key, " '", text,
               "' is neither an added token nor a piece of ", model_path.string());
    sp.mark_special(text);
    return *id;
  };
  s->eos = special("eos_token", "</s>");
  s->unk = special("unk_token", "<unk>");
  s->pad = special("pad_token", "<pad>");
  sp.set_unk_token(config.special_token("unk_token").value_or("<unk>"));
  s->max_length = config.model_max_length(512);
  return T5Tokenizer(std::move(s));
}

std::vector<std::string> T5Tokenizer::tokenize(const std::string& text) const {
  if (s_->fast) return s_->fast->tokenize(text);
  std::vector<std::string> out;
  for (auto& t : s_->sp->tokenize(text)) out.push_back(std::move(t.text));
  return out;
}

std::vector<int64_t> T5Tokenizer::encode(const std::string& text) const {
  if (s_->fast) {
    std::vector<int64_t> ids = s_->fast->encode(text, /*add_special_tokens=*/false);
    ids.push_back(s_->eos);
    return ids;
  }
  std::vector<int64_t> ids;
  for (const auto& t : s_->sp->tokenize(text)) ids.push_back(t.id);
  // T5Tokenizer._add_eos_if_not_present: no second </s> after one written in the text.
  if (ids.empty() || ids.back() != s_->eos) ids.push_back(s_->eos);
  return ids;
}

std::vector<int64_t> T5Tokenizer::encode_padded(const std::string& text, int64_t max_length) const {
  KILN_CHECK(max_length >= 1, "tokenizer", "T5 max_length must be positive, got ", max_length);
  std::vector<int64_t> ids;
  if (s_->fast) ids = s_->fast->encode(text, /*add_special_tokens=*/false);
  else
    for (const auto& t : s_->sp->tokenize(text)) ids.push_back(t.id);
  if (int64_t(ids.size()) + 1 > max_length) {
    // transformers cannot truncate when </s> alone fills max_length; refuse instead.
    KILN_CHECK(max_length > 1, "tokenizer", "T5 max_length ", max_length, " leaves no room for text tokens");
    ids.resize(size_t(max_length - 1));
  }
  if (s_->fast || ids.empty() || ids.back() != s_->eos) ids.push_back(s_->eos);
  ids.resize(size_t(max_length), s_->pad);
  return ids;
}

int64_t T5Tokenizer::model_max_length() const { return s_->max_length; }
int64_t T5Tokenizer::eos_id() const { return s_->eos; }
int64_t T5Tokenizer::pad_id() const { return s_->pad; }
int64_t T5Tokenizer::unk_id() const { return s_->unk; }
int64_t T5Tokenizer::vocab_size() const {
  if (s_->fast) return s_->fast->vocab_size();
  int64_t n = s_->sp->piece_size();
  for (const auto& t : s_->sp->added_tokens()) n = std::max(n, t.id + 1);
  return n;
}

}  // namespace kiln::tokenizers
