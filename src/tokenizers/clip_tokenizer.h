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
#include <memory>
#include <string>
#include <vector>

namespace kiln::tokenizers {

class ClipTokenizer {
 public:
  static ClipTokenizer from_pretrained(const std::filesystem::path& dir);

  // BPE token strings of `text` (added tokens such as "<|endoftext|>" written in the text stay
  // whole), without bos/eos.
  std::vector<std::string> tokenize(const std::string& text) const;
  // [bos] + ids + [eos], untruncated.
  std::vector<int64_t> encode(const std::string& text) const;
  // padding="max_length", truncation=True: [bos] + the first max_length-2 ids + [eos], then
  // pad ids up to max_length. max_length < 0 means model_max_length().
  std::vector<int64_t> encode_padded(const std::string& text, int64_t max_length = -1) const;

  int64_t model_max_length() const;  // tokenizer_config.json's model_max_length (77 if absent)
  int64_t bos_id() const;
  int64_t eos_id() const;
  int64_t pad_id() const;
  int64_t unk_id() const;
  int64_t vocab_size() const;  // entries of vocab.json plus added tokens outside it

  struct State;

 private:
  explicit ClipTokenizer(std::shared_ptr<State> s) : s_(std::move(s)) {}
  std::shared_ptr<State> s_;  // shared by copies, with the BPE cache inside (thread-safe)
};

}  // namespace kiln::tokenizers
