// CLIP's byte-level BPE tokenizer (transformers' CLIPTokenizer without ftfy), read from a
// tokenizer folder: vocab.json + merges.txt (or tokenizer.json's model.vocab / model.merges),
// with the special tokens from tokenizer_config.json / special_tokens_map.json.
//
//   auto tok = ClipTokenizer::from_pretrained(root / "tokenizer");
//   std::vector<int64_t> ids = tok.encode_padded("a photo of a cat");  // 77 ids: bos ... eos pad...
//
// Text cleanup (BasicTokenizer path): drop control characters, U+0000 and U+FFFD,
// whitespace -> space, spaces around CJK ideographs, NFC, split on whitespace, lowercase; then the
// pre-tokenisation regex, the GPT-2 byte-to-unicode map and BPE with "</w>" on the last symbol.
#pragma once
#include <cstdint>
#include <filesystem>
#include <vector>

#include "tokenizers/pretrained_tokenizer.h"

namespace kiln::tokenizers {

// tokenize(text): the BPE token strings (added tokens such as "<|endoftext|>" written in the text stay
// whole); encode(text): [bos] + their ids + [eos], without bos/eos when add_special_tokens is false.
class ClipTokenizer : public RequiredSpecialsTokenizer {
 public:
  static ClipTokenizer from_pretrained(const std::filesystem::path& dir);

  // padding="max_length", truncation=True: [bos] + the first max_length-2 ids + [eos], then
  // pad ids up to max_length. max_length < 0 means model_max_length() (77 if the folder sets none).
  std::vector<int64_t> encode_padded(const std::string& text, int64_t max_length = -1) const;

  int64_t bos_id() const { return *s_->bos; }

 private:
  using RequiredSpecialsTokenizer::RequiredSpecialsTokenizer;
};

}  // namespace kiln::tokenizers
