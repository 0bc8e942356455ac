// The tokenizer a FLUX.2 pipeline holds for its prompts: whichever of transformers' two kinds the
// folder is, with tokenizer_config.json's padding and special-token settings, as AutoTokenizer /
// the model_index class would load it:
//
//   auto tok = PromptTokenizer::from_pretrained(root / "tokenizer");
//   auto enc = tok.encode_padded(chat_text, 512, /*add_special_tokens=*/false);  // ids + attention mask
//
// - tokenizer.json present (unless prefer_sentencepiece and tokenizer.model exists): the fast tokenizer
//   (HfTokenizer, byte-level BPE: Tekken, Qwen2/Qwen3). tokenizer.json's own "padding"/"truncation"
//   blocks give the defaults of pad_token, padding_side and truncation_side, as PreTrainedTokenizerFast
//   takes them; tokenizer_config.json overrides them.
//   For tokenizer_class LlamaTokenizerFast the special tokens added by add_special_tokens=True are
//   [bos] (add_bos_token, default true) and [eos] (add_eos_token, default false), because transformers
//   rebuilds that class's post-processor from those flags; for other classes they are tokenizer.json's.
// - else tokenizer.model: transformers' slow LlamaTokenizer (llama_tokenizer.h). T5's spiece.model
//   folders are T5Tokenizer's (t5_tokenizer.h) and not read here.
//
// encode_padded is tokenizer(text, padding="max_length", truncation=True, max_length=N): the text's ids
// are cut (on truncation_side, transformers' default "right") so that they plus the special tokens fit
// in N, then pad ids fill up to N on padding_side (default "right"); attention_mask is 1 on real tokens.
//
// Errors name the folder's file and field: a padding_side/truncation_side other than "left"/"right",
// special tokens that are not single tokens of the tokenizer (transformers would add them as new
// tokens), split_special_tokens true, and padding without a pad_token.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tokenizers/pretrained_tokenizer.h"

namespace kiln::tokenizers {

class PromptTokenizer : public PretrainedTokenizer {
 public:
  enum class Kind { tokenizer_json, sentencepiece };
  enum class Side { right, left };

  // prefer_sentencepiece: read tokenizer.model even when tokenizer.json exists, for a component whose
  // model_index.json class is the slow LlamaTokenizer (Diffusers then loads that class, which reads
  // tokenizer.model; AutoTokenizer and processors load the fast one).
  static PromptTokenizer from_pretrained(const std::filesystem::path& dir, bool prefer_sentencepiece = false);

  Kind kind() const;

  struct Encoding {
    std::vector<int64_t> ids;             // exactly max_length ids
    std::vector<int64_t> attention_mask;  // 1 on real tokens, 0 on padding
  };
  // padding="max_length", truncation=True, max_length (see the top of this file).
  Encoding encode_padded(const std::string& text, int64_t max_length, bool add_special_tokens = true) const;

  // The id of one token (added tokens first, then the vocabulary), nullopt when it is not one token.
  std::optional<int64_t> id_of(const std::string& token) const;
  // The pad token's id; an error naming tokenizer_config.json when the folder sets no pad_token.
  int64_t pad_id() const;
  std::optional<int64_t> bos_id() const;
  std::optional<int64_t> eos_id() const;
  // The special tokens' texts (special_tokens_map.json wins over tokenizer_config.json); nullopt when unset.
  const std::optional<std::string>& pad_token() const;
  const std::optional<std::string>& bos_token() const;
  const std::optional<std::string>& eos_token() const;
  Side padding_side() const;
  Side truncation_side() const;
  // tokenizer_config.json's model_max_length; nullopt when absent or transformers' "no limit" (1e30).
  std::optional<int64_t> model_max_length() const;
  // Special tokens add_special_tokens=True puts around one text.
  int64_t num_special_tokens_to_add() const;

 private:
  using PretrainedTokenizer::PretrainedTokenizer;
};

}  // namespace kiln::tokenizers
