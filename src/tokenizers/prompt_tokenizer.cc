#include "tokenizers/prompt_tokenizer.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_config.h"
#include "tokenizers/hf_tokenizer.h"
#include "tokenizers/llama_tokenizer.h"
#include "tokenizers/tokenizer_files.h"

namespace kiln::tokenizers {
namespace fs = std::filesystem;

namespace {

struct PromptState : PretrainedTokenizer::State {
  PromptTokenizer::Kind kind = PromptTokenizer::Kind::tokenizer_json;
  std::optional<HfTokenizer> hf;
  std::optional<LlamaTokenizer> llama;
  // LlamaTokenizerFast: transformers rebuilds the post-processor as [bos]? $A [eos]?.
  bool flag_specials = false, add_bos = false, add_eos = false;
  std::optional<std::string> pad_token, bos_token, eos_token;
  PromptTokenizer::Side padding = PromptTokenizer::Side::right, truncation = PromptTokenizer::Side::right;

  std::string config_file() const { return (dir / "tokenizer_config.json").string(); }

  std::vector<int64_t> plain_ids(const std::string& text) const {
    return llama ? llama->encode(text, false) : hf->encode(text, false);
  }
  int64_t n_special() const {
    if (llama) return llama->num_special_tokens_to_add();
    if (flag_specials) return int64_t(add_bos) + int64_t(add_eos);
    return hf->num_special_tokens_to_add();
  }
  // The ids with the special tokens of add_special_tokens=True, for the kinds that are not
  // tokenizer.json's post-processor.
  std::vector<int64_t> with_specials(std::vector<int64_t> ids) const {
    if (llama) return llama->add_special_tokens(std::move(ids));
    if (add_bos) ids.insert(ids.begin(), *bos);
    if (add_eos) ids.push_back(*eos);
    return ids;
  }

  std::vector<std::string> tokenize(const std::string& text) const override {
    return llama ? llama->tokenize(text) : hf->tokenize(text);
  }
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const override {
    if (hf && !flag_specials) return hf->encode(text, add_special_tokens);
    auto ids = plain_ids(text);
    return add_special_tokens ? with_specials(std::move(ids)) : ids;
  }
  int64_t vocab_size() const override { return llama ? llama->vocab_size() : hf->vocab_size(); }
};

PromptTokenizer::Side parse_side(const nlohmann::json& v, const std::string& where, const std::string& key) {
  KILN_CHECK(v.is_string(), "tokenizer", where, ": ", key, " is ", io::json_kind(v), ", expected \"left\" or \"right\"");
  std::string s = v.get<std::string>();
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  KILN_CHECK(s == "left" || s == "right", "tokenizer", where, ": ", key, " '", v.get<std::string>(),
             "' is not \"left\" or \"right\"");
  return s == "left" ? PromptTokenizer::Side::left : PromptTokenizer::Side::right;
}

// padding_side / truncation_side: tokenizer_config.json, else `fallback`.
PromptTokenizer::Side config_side(const TokenizerConfig& c, const std::string& key, PromptTokenizer::Side fallback) {
  const auto it = c.config.find(key);
  if (it == c.config.end() || it->is_null()) return fallback;
  return parse_side(*it, (c.dir / "tokenizer_config.json").string(), key);
}

// Every special token of the config (bos, eos, ..., additional_special_tokens) must be one added token of
// tokenizer.json: transformers adds any other as a new no-split token, which kiln does not.
void check_hf_special_tokens(const HfTokenizer& hf, const TokenizerConfig& c, const fs::path& json_path) {
  std::vector<std::pair<std::string, std::string>> tokens;  // key, text
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"})
    if (auto t = c.special_token(key)) tokens.emplace_back(key, *t);
  for (const auto* j : {&c.config, &c.special_map}) {
    const auto it = j->find("additional_special_tokens");
    if (it == j->end() || !it->is_array()) continue;
    for (const auto& t : *it) {
      if (t.is_string()) tokens.emplace_back("additional_special_tokens", t.get<std::string>());
      else if (t.is_object() && t.contains("content") && t["content"].is_string())
        tokens.emplace_back("additional_special_tokens", t["content"].get<std::string>());
    }
  }
  for (const auto& [key, text] : tokens) {
    const bool single = hf.id_of(text).has_value() && hf.tokenize(text) == std::vector<std::string>{text};
    KILN_CHECK(single, "tokenizer", c.dir.string(), ": ", key, " '", text, "' is not an added token of ",
               json_path.string(), " (transformers would add it as a new token; kiln does not)");
  }
}

}  // namespace

PromptTokenizer PromptTokenizer::from_pretrained(const fs::path& dir, bool prefer_sentencepiece) {
  const auto config = open_folder(dir, "prompt tokenizer");
  auto s = std::make_shared<PromptState>();
  s->dir = dir;
  const std::string where = s->config_file();
  KILN_CHECK(!config.flag("split_special_tokens", false), "tokenizer", where,
             ": split_special_tokens true is not supported by kiln");

  Side padding_default = Side::right, truncation_default = Side::right;
  std::optional<std::string> pad_default;
  std::error_code ec;
  const fs::path json_path = dir / "tokenizer.json", model_path = dir / "tokenizer.model";
  const bool use_json = fs::exists(json_path, ec) && !(prefer_sentencepiece && fs::exists(model_path, ec));
  if (use_json) {
    s->kind = Kind::tokenizer_json;
    const auto j = read_json(json_path, "tokenizer.json");
    s->hf = HfTokenizer::from_json(j, json_path.string());
    // PreTrainedTokenizerFast takes these as defaults from the file's own padding/truncation settings.
    if (const auto it = j.find("padding"); it != j.end() && it->is_object()) {
      if (it->contains("direction")) padding_default = parse_side((*it)["direction"], json_path.string(), "padding.direction");
      if (it->contains("pad_token") && (*it)["pad_token"].is_string()) pad_default = (*it)["pad_token"].get<std::string>();
    }
    if (const auto it = j.find("truncation"); it != j.end() && it->is_object() && it->contains("direction"))
      truncation_default = parse_side((*it)["direction"], json_path.string(), "truncation.direction");
    // PreTrainedTokenizerFast rewrites a top-level pre-tokenizer whose add_prefix_space differs from the config's.
    if (const auto it = config.config.find("add_prefix_space"); it != config.config.end() && it->is_boolean()) {
      const auto pre = j.find("pre_tokenizer");
      if (pre != j.end() && pre->is_object() && pre->contains("add_prefix_space"))
        KILN_CHECK((*pre)["add_prefix_space"] == *it, "tokenizer", where, ": add_prefix_space ", it->dump(),
                   " differs from ", json_path.string(), " pre_tokenizer.add_prefix_space (transformers would rewrite "
                   "the pre-tokenizer; kiln does not)");
    }
    check_hf_special_tokens(*s->hf, config, json_path);
    if (json_string(config.config, "tokenizer_class", "") == "LlamaTokenizerFast") {
      const auto it = config.config.find("add_prefix_space");
      KILN_CHECK(it == config.config.end() || it->is_null(), "tokenizer", where,
                 ": add_prefix_space with tokenizer_class LlamaTokenizerFast is not supported (transformers rebuilds "
                 "that tokenizer from tokenizer.model; kiln reads tokenizer.json)");
      s->flag_specials = true;
      s->add_bos = config.flag("add_bos_token", true);
      s->add_eos = config.flag("add_eos_token", false);
    }
  } else if (fs::exists(model_path, ec)) {
    s->kind = Kind::sentencepiece;
    s->llama = LlamaTokenizer::from_pretrained(dir);
  } else {
    fail("tokenizer", dir.string(), ": neither tokenizer.json nor tokenizer.model found (kiln reads a fast "
         "tokenizer's tokenizer.json or a LlamaTokenizer's tokenizer.model)");
  }

  // Special tokens by name; LlamaTokenizer's defaults for a tokenizer.model folder.
  const bool spm = s->kind == Kind::sentencepiece;
  s->bos_token = config.special_token("bos_token", spm ? std::optional<std::string>("<s>") : std::nullopt);
  s->eos_token = config.special_token("eos_token", spm ? std::optional<std::string>("</s>") : std::nullopt);
  s->pad_token = config.special_token("pad_token", pad_default);
  auto id = [&](const std::optional<std::string>& text, const char* key) -> std::optional<int64_t> {
    if (!text) return std::nullopt;
    const auto i = s->llama ? s->llama->id_of(*text) : s->hf->id_of(*text);
    KILN_CHECK(i.has_value(), "tokenizer", dir.string(), ": ", key, " '", *text, "' is not a token of the tokenizer");
    return i;
  };
  s->bos = id(s->bos_token, "bos_token");
  s->eos = id(s->eos_token, "eos_token");
  s->pad = id(s->pad_token, "pad_token");
  KILN_CHECK(!s->flag_specials || !s->add_bos || s->bos, "tokenizer", where, ": add_bos_token is true but there is no bos_token");
  KILN_CHECK(!s->flag_specials || !s->add_eos || s->eos, "tokenizer", where, ": add_eos_token is true but there is no eos_token");

  s->padding = config_side(config, "padding_side", padding_default);
  s->truncation = config_side(config, "truncation_side", truncation_default);
  const int64_t max_len = config.model_max_length(-1);
  if (max_len > 0) s->max_length = max_len;
  return PromptTokenizer(std::move(s));
}

PromptTokenizer::Kind PromptTokenizer::kind() const { return state<PromptState>().kind; }

PromptTokenizer::Encoding PromptTokenizer::encode_padded(const std::string& text, int64_t max_length,
                                                         bool add_special_tokens) const {
  const auto& s = state<PromptState>();
  KILN_CHECK(max_length > 0, "tokenizer", s.dir.string(), ": max_length must be positive, got ", max_length);
  const int64_t pad = pad_id();
  const int64_t n_special = add_special_tokens ? s.n_special() : 0;
  std::vector<int64_t> ids;
  if (s.hf && !s.flag_specials && n_special > 0) {
    // tokenizer.json's post-processor adds the special tokens; HfTokenizer truncates before it, on the right.
    KILN_CHECK(s.truncation == Side::right, "tokenizer", s.config_file(),
               ": truncation_side \"left\" with tokenizer.json's special tokens (add_special_tokens=True) is not "
               "supported by kiln");
    auto p = s.hf->encode_padded(text, max_length, pad, true);
    ids = std::move(p.ids);
    ids.resize(size_t(std::count(p.attention_mask.begin(), p.attention_mask.end(), 1)));
  } else {
    ids = s.plain_ids(text);
    const int64_t excess = int64_t(ids.size()) + n_special - max_length;
    if (excess > 0) {
      // transformers does not truncate (and returns more than max_length ids) when the special tokens alone
      // fill max_length; kiln refuses instead.
      KILN_CHECK(max_length > n_special, "tokenizer", s.dir.string(), ": max_length ", max_length,
                 " leaves no room for text tokens next to the ", n_special, " special tokens");
      if (s.truncation == Side::right) ids.resize(ids.size() - size_t(excess));
      else ids.erase(ids.begin(), ids.begin() + excess);
    }
    if (add_special_tokens) ids = s.with_specials(std::move(ids));
  }
  const size_t n = ids.size(), total = size_t(max_length);
  Encoding e;
  if (s.padding == Side::right) {
    e.ids = std::move(ids);
    e.ids.resize(total, pad);
    e.attention_mask.assign(n, 1);
    e.attention_mask.resize(total, 0);
  } else {
    e.ids.assign(total - n, pad);
    e.ids.insert(e.ids.end(), ids.begin(), ids.end());
    e.attention_mask.assign(total - n, 0);
    e.attention_mask.resize(total, 1);
  }
  return e;
}

std::optional<int64_t> PromptTokenizer::id_of(const std::string& token) const {
  const auto& s = state<PromptState>();
  return s.llama ? s.llama->id_of(token) : s.hf->id_of(token);
}

int64_t PromptTokenizer::pad_id() const {
  KILN_CHECK(s_->pad.has_value(), "tokenizer", state<PromptState>().config_file(),
             ": no pad_token (set in neither tokenizer_config.json nor special_tokens_map.json); kiln pads prompts to "
             "max_length with it");
  return *s_->pad;
}

std::optional<int64_t> PromptTokenizer::bos_id() const { return s_->bos; }
std::optional<int64_t> PromptTokenizer::eos_id() const { return s_->eos; }
const std::optional<std::string>& PromptTokenizer::pad_token() const { return state<PromptState>().pad_token; }
const std::optional<std::string>& PromptTokenizer::bos_token() const { return state<PromptState>().bos_token; }
const std::optional<std::string>& PromptTokenizer::eos_token() const { return state<PromptState>().eos_token; }
PromptTokenizer::Side PromptTokenizer::padding_side() const { return state<PromptState>().padding; }
PromptTokenizer::Side PromptTokenizer::truncation_side() const { return state<PromptState>().truncation; }
std::optional<int64_t> PromptTokenizer::model_max_length() const { return s_->max_length; }
int64_t PromptTokenizer::num_special_tokens_to_add() const { return state<PromptState>().n_special(); }

}  // namespace kiln::tokenizers
