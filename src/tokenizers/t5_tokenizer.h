// The T5 tokenizer of FLUX's second text encoder: SentencePiece (spiece.model) plus the added
// tokens transformers keeps outside the model (<pad>, </s>, <unk>, <extra_id_k>), with the
// slow T5Tokenizer's rules: the text is split on added tokens, each piece goes
// through SentencePiece, and </s> is appended.
//
// A folder with tokenizer.json but no spiece.model (some FLUX.1 / SD3 re-uploads) is read with kiln's
// tokenizer.json reader (HfTokenizer: Unigram, Precompiled charsmap, Metaspace) and gives what transformers'
// T5TokenizerFast gives for it. The two differ on a few inputs: the fast one always appends </s> (also after
// a </s> written in the text) and it splits words at every Unicode whitespace character (U+0085, say), which
// SentencePiece keeps as an unknown character. When both files are there, spiece.model is used.
//
//   auto tok = T5Tokenizer::from_pretrained(root / "tokenizer_2");
//   std::vector<int64_t> ids = tok.encode_padded(prompt, 512);  // ids[:511] + [</s>], then <pad>s
#pragma once
#include <cstdint>
#include <filesystem>
#include <vector>

#include "tokenizers/pretrained_tokenizer.h"

namespace kiln::tokenizers {

// tokenize(text): the SentencePiece pieces and added tokens, without </s>; encode(text): their ids + [</s>]
// (spiece.model: no eos is added when the text already ends with one), without it when add_special_tokens is
// false. vocab_size(): SentencePiece pieces (or tokenizer.json's vocabulary) plus added tokens beyond them.
class T5Tokenizer : public RequiredSpecialsTokenizer {
 public:
  static T5Tokenizer from_pretrained(const std::filesystem::path& dir);

  // padding="max_length", truncation=True: the first max_length-1 ids + [</s>], then pad ids.
  // model_max_length() is 512 if the folder sets none.
  std::vector<int64_t> encode_padded(const std::string& text, int64_t max_length) const;

 private:
  using RequiredSpecialsTokenizer::RequiredSpecialsTokenizer;
};

}  // namespace kiln::tokenizers
