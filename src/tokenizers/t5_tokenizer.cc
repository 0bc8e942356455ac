#include "tokenizers/t5_tokenizer.h"

#include <optional>

#include "core/error.h"
#include "tokenizers/hf_tokenizer.h"
#include "tokenizers/sentencepiece_slow.h"
#include "tokenizers/tokenizer_files.h"

namespace kiln::tokenizers {
namespace fs = std::filesystem;

namespace {
struct T5State : PretrainedTokenizer::State {
  std::optional<SlowSentencePiece> sp;
  std::optional<HfTokenizer> fast;  // a folder with tokenizer.json but no spiece.model

  std::vector<std::string> tokenize(const std::string& text) const override {
    if (fast) return fast->tokenize(text);
    std::vector<std::string> out;
    for (auto& t : sp->tokenize(text)) out.push_back(std::move(t.text));
    return out;
  }
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const override;
  int64_t vocab_size() const override { return fast ? fast->vocab_size() : sp->vocab_size(); }
};

std::vector<int64_t> T5State::encode(const std::string& text, bool add_special_tokens) const {
  if (fast) {
    std::vector<int64_t> ids = fast->encode(text, /*add_special_tokens=*/false);
    if (add_special_tokens) ids.push_back(*eos);
    return ids;
  }
  std::vector<int64_t> ids;
  for (const auto& t : sp->tokenize(text)) ids.push_back(t.id);
  // T5Tokenizer._add_eos_if_not_present: no second </s> after one written in the text.
  if (add_special_tokens && (ids.empty() || ids.back() != *eos)) ids.push_back(*eos);
  return ids;
}
}  // namespace

T5Tokenizer T5Tokenizer::from_pretrained(const fs::path& dir) {
  const auto config = open_folder(dir, "T5 tokenizer");
  auto s = std::make_shared<T5State>();
  s->dir = dir;
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

std::vector<int64_t> T5Tokenizer::encode_padded(const std::string& text, int64_t max_length) const {
  KILN_CHECK(max_length >= 1, "tokenizer", "T5 max_length must be positive, got ", max_length);
  const bool fast = state<T5State>().fast.has_value();
  std::vector<int64_t> ids = encode(text, /*add_special_tokens=*/false);
  if (int64_t(ids.size()) + 1 > max_length) {
    // transformers cannot truncate when </s> alone fills max_length; refuse instead.
    KILN_CHECK(max_length > 1, "tokenizer", "T5 max_length ", max_length, " leaves no room for text tokens");
    ids.resize(size_t(max_length - 1));
  }
  if (fast || ids.empty() || ids.back() != eos_id()) ids.push_back(eos_id());
  ids.resize(size_t(max_length), pad_id());
  return ids;
}

}  // namespace kiln::tokenizers
