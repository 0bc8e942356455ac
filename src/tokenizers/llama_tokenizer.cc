#include "tokenizers/llama_tokenizer.h"

#include "core/error.h"
#include "io/json_config.h"
#include "tokenizers/sentencepiece_slow.h"
#include "tokenizers/tokenizer_files.h"

namespace kiln::tokenizers {
namespace fs = std::filesystem;

namespace {

struct LlamaState : PretrainedTokenizer::State {
  std::optional<SlowSentencePiece> sp;
  bool add_bos = true, add_eos = false;

  std::vector<std::string> tokenize(const std::string& text) const override {
    std::vector<std::string> out;
    for (auto& t : sp->tokenize(text)) out.push_back(std::move(t.text));
    return out;
  }
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const override {
    std::vector<int64_t> ids;
    for (const auto& t : sp->tokenize(text)) ids.push_back(t.id);
    return add_special_tokens ? with_specials(std::move(ids)) : ids;
  }
  int64_t vocab_size() const override { return sp->vocab_size(); }

  // build_inputs_with_special_tokens.
  std::vector<int64_t> with_specials(std::vector<int64_t> ids) const {
    if (add_bos) ids.insert(ids.begin(), *bos);
    if (add_eos) ids.push_back(*eos);
    return ids;
  }
};

// Texts of a list of tokens given as strings or {"content": ...} objects.
std::vector<std::string> token_list(const nlohmann::json& v, const fs::path& file, const std::string& key) {
  std::vector<std::string> out;
  if (v.is_null()) return out;
  KILN_CHECK(v.is_array(), "tokenizer", file.string(), ": ", key, " is ", io::json_kind(v), ", expected a list");
  for (const auto& t : v) {
    if (t.is_string()) {
      out.push_back(t.get<std::string>());
    } else {
      KILN_CHECK(t.is_object() && t.contains("content") && t["content"].is_string(), "tokenizer", file.string(), ": ",
                 key, " has an entry that is neither a string nor {\"content\": ...}");
      out.push_back(t["content"].get<std::string>());
    }
  }
  return out;
}

// The settings of tokenizer_config.json this reader does not implement and that would change the ids.
void check_supported(const TokenizerConfig& c) {
  const auto where = (c.dir / "tokenizer_config.json").string();
  const std::string cls = json_string(c.config, "tokenizer_class", "LlamaTokenizer");
  KILN_CHECK(cls == "LlamaTokenizer", "tokenizer", where, ": tokenizer_class '", cls,
             "' is not supported with tokenizer.model (kiln reads a tokenizer.model folder as transformers' slow "
             "LlamaTokenizer; a fast tokenizer needs tokenizer.json)");
  if (const auto it = c.config.find("sp_model_kwargs"); it != c.config.end() && !it->is_null())
    KILN_CHECK(it->is_object() && it->empty(), "tokenizer", where, ": sp_model_kwargs ", it->dump(),
               " is not supported (kiln runs SentencePiece with its defaults: no sampling)");
  KILN_CHECK(!c.flag("do_lower_case", false), "tokenizer", where,
             ": do_lower_case true is not supported by kiln's LlamaTokenizer");
  KILN_CHECK(!c.flag("split_special_tokens", false), "tokenizer", where,
             ": split_special_tokens true is not supported by kiln's LlamaTokenizer");
  if (const auto it = c.config.find("added_tokens_decoder"); it != c.config.end() && it->is_object())
    for (const auto& [id, t] : it->items())
      KILN_CHECK(!json_flag(t, "single_word"), "tokenizer", where, ": added_tokens_decoder[", id,
                 "] has single_word true, which kiln's LlamaTokenizer does not implement");
}

}  // namespace

LlamaTokenizer LlamaTokenizer::from_pretrained(const fs::path& dir) {
  const auto config = open_folder(dir, "Llama tokenizer");
  check_supported(config);
  auto s = std::make_shared<LlamaState>();
  s->dir = dir;
  const fs::path model_path = dir / "tokenizer.model";
  // LlamaTokenizer: legacy unset means legacy (with a warning in transformers).
  const bool legacy = config.flag("legacy", true);
  s->sp.emplace(model_path, "SentencePiece model (tokenizer.model)", legacy,
                config.flag("add_prefix_space", true));
  SlowSentencePiece& sp = *s->sp;
  s->add_bos = config.flag("add_bos_token", true);
  s->add_eos = config.flag("add_eos_token", false);

  for (auto& t : config.added_tokens()) sp.add_token(std::move(t));

  // Every special token is a no-split token (transformers' _add_tokens of all_special_tokens); one
  // that is neither added nor a piece would get a new id in transformers.
  auto special = [&](const std::string& key, const std::string& text) {
    const auto id = sp.add_special_token(text);
    KILN_CHECK(id.has_value(), "tokenizer", dir.string(), ": ", key, " '", text,
               "' is neither an added token (tokenizer_config.json added_tokens_decoder) nor a piece of ",
               model_path.string());
    sp.mark_special(text);
    return *id;
  };
  auto named = [&](const std::string& key, std::optional<std::string> fallback) -> std::optional<int64_t> {
    const auto text = config.special_token(key, std::move(fallback));
    if (!text) return std::nullopt;
    return special(key, *text);
  };
  s->bos = named("bos_token", "<s>");
  s->eos = named("eos_token", "</s>");
  s->unk = named("unk_token", "<unk>");
  s->pad = named("pad_token", std::nullopt);
  for (const char* key : {"sep_token", "cls_token", "mask_token"}) named(key, std::nullopt);
  std::vector<std::string> additional;
  for (const auto* j : {&config.config, &config.special_map})
    if (j->contains("additional_special_tokens"))
      for (auto& t : token_list((*j)["additional_special_tokens"],
                                dir / (j == &config.config ? "tokenizer_config.json" : "special_tokens_map.json"),
                                "additional_special_tokens"))
        additional.push_back(std::move(t));
  if (const auto it = config.config.find("extra_special_tokens"); it != config.config.end() && it->is_object())
    for (const auto& [key, v] : it->items())
      for (auto& t : token_list(nlohmann::json::array({v}), dir / "tokenizer_config.json", "extra_special_tokens"))
        additional.push_back(std::move(t));
  for (const auto& t : additional) special("additional_special_tokens", t);

  const auto where = (dir / "tokenizer_config.json").string();
  KILN_CHECK(s->bos || !s->add_bos, "tokenizer", where, ": add_bos_token is true but there is no bos_token");
  KILN_CHECK(s->eos || !s->add_eos, "tokenizer", where, ": add_eos_token is true but there is no eos_token");
  if (!legacy) {
    const auto unk = config.special_token("unk_token", "<unk>");
    KILN_CHECK(unk.has_value(), "tokenizer", where, ": legacy false needs an unk_token (its encoding rule uses it)");
    sp.set_unk_token(*unk);
  }
  return LlamaTokenizer(std::move(s));
}

std::vector<int64_t> LlamaTokenizer::add_special_tokens(std::vector<int64_t> ids) const {
  return state<LlamaState>().with_specials(std::move(ids));
}

int64_t LlamaTokenizer::num_special_tokens_to_add() const {
  const auto& s = state<LlamaState>();
  return int64_t(s.add_bos) + int64_t(s.add_eos);
}

std::optional<int64_t> LlamaTokenizer::id_of(const std::string& token) const {
  const auto& sp = *state<LlamaState>().sp;
  if (auto id = sp.added_id(token)) return id;
  return sp.piece_id(token);
}

std::string LlamaTokenizer::token_of(int64_t id) const {
  const auto& sp = *state<LlamaState>().sp;
  for (const auto& t : sp.added_tokens())
    if (t.id == id) return t.content;
  return sp.id_to_piece(id);
}

std::optional<int64_t> LlamaTokenizer::bos_id() const { return s_->bos; }
std::optional<int64_t> LlamaTokenizer::eos_id() const { return s_->eos; }
std::optional<int64_t> LlamaTokenizer::unk_id() const { return s_->unk; }
std::optional<int64_t> LlamaTokenizer::pad_id() const { return s_->pad; }
bool LlamaTokenizer::add_bos_token() const { return state<LlamaState>().add_bos; }
bool LlamaTokenizer::add_eos_token() const { return state<LlamaState>().add_eos; }
bool LlamaTokenizer::legacy() const { return state<LlamaState>().sp->legacy(); }

}  // namespace kiln::tokenizers
