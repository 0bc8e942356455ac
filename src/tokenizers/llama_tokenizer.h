// transformers' slow LlamaTokenizer: a SentencePiece model (tokenizer.model) plus the added tokens of
// tokenizer_config.json ("added_tokens_decoder") and the special tokens of special_tokens_map.json /
// tokenizer_config.json. The FLUX.2 golden's stand-in tokenizer is one (legacy=false, Mistral-style
// [INST] tokens):
//
//   auto tok = LlamaTokenizer::from_pretrained(root / "tokenizer");
//   tok.encode("hello");                                   // [<s>, ▁hello]
//   tok.encode("<s>[INST]hi[/INST]", /*add_special_tokens=*/false);
//
// The tokenize rules (legacy and legacy=false with add_prefix_space) are T5Tokenizer's, shared in
// sentencepiece_slow.h; add_special_tokens puts bos in front (add_bos_token, default true) and eos
// behind (add_eos_token, default false).
//
// tokenizer_config.json settings that would change the ids and that kiln does not implement are errors
// naming the file and field: a tokenizer_class other than LlamaTokenizer, sp_model_kwargs (sampling),
// do_lower_case, split_special_tokens, added tokens with single_word, and special tokens that are
// neither added tokens nor pieces of the model (transformers would append them to the vocabulary).
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tokenizers/pretrained_tokenizer.h"

namespace kiln::tokenizers {

// tokenize(text): token strings such as "▁cat", "<0x09>" and added tokens verbatim, without bos/eos.
// vocab_size(): pieces plus added tokens beyond them.
class LlamaTokenizer : public PretrainedTokenizer {
 public:
  // dir / "tokenizer.model" with dir's tokenizer_config.json and special_tokens_map.json.
  static LlamaTokenizer from_pretrained(const std::filesystem::path& dir);

  // build_inputs_with_special_tokens: [bos] + ids + [eos] as add_bos_token / add_eos_token say.
  std::vector<int64_t> add_special_tokens(std::vector<int64_t> ids) const;
  int64_t num_special_tokens_to_add() const;

  // convert_tokens_to_ids for one token: added tokens first, then the model's pieces.
  std::optional<int64_t> id_of(const std::string& token) const;
  // The token string of an id (an added token's content, else the piece).
  std::string token_of(int64_t id) const;
  std::optional<int64_t> bos_id() const;
  std::optional<int64_t> eos_id() const;
  std::optional<int64_t> unk_id() const;
  std::optional<int64_t> pad_id() const;
  bool add_bos_token() const;
  bool add_eos_token() const;
  bool legacy() const;

 private:
  using PretrainedTokenizer::PretrainedTokenizer;
};

}  // namespace kiln::tokenizers
