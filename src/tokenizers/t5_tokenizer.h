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
#include <memory>
#include <string>
#include <vector>

namespace kiln::tokenizers {

class T5Tokenizer {
 public:
  static T5Tokenizer from_pretrained(const std::filesystem::path& dir);

  // SentencePiece pieces and added tokens of `text`, without </s>.
  std::vector<std::string> tokenize(const std::string& text) const;
  // ids + [</s>] (spiece.model: no eos is added when the text already ends with one), untruncated.
  std::vector<int64_t> encode(const std::string& text) const;
  // padding="max_length", truncation=True: the first max_length-1 ids + [</s>], then pad ids.
  std::vector<int64_t> encode_padded(const std::string& text, int64_t max_length) const;

  int64_t model_max_length() const;  // tokenizer_config.json's model_max_length (512 if absent)
  int64_t eos_id() const;
  int64_t pad_id() const;
  int64_t unk_id() const;
  int64_t vocab_size() const;  // SentencePiece pieces (or tokenizer.json's vocabulary) plus added tokens beyond them

  struct State;

 private:
  explicit T5Tokenizer(std::shared_ptr<const State> s) : s_(std::move(s)) {}
  std::shared_ptr<const State> s_;
};

}  // namespace kiln::tokenizers
