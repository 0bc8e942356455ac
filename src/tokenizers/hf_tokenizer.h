// A Hugging Face `tokenizer.json` reader for byte-level BPE tokenizers (Qwen2/Qwen3, Mistral "Tekken",
// GPT-2 style) and SentencePiece Unigram ones (T5, as FLUX.1 / SD3 folders carry it), giving the ids the
// `tokenizers` library gives:
//
//   auto tok = HfTokenizer::from_pretrained(root / "tokenizer");     // tokenizer/tokenizer.json
//   std::vector<int64_t> ids = tok.encode("<|im_start|>user\nA cat<|im_end|>\n", /*add_special_tokens=*/false);
//   auto padded = tok.encode_padded(prompt, 512, *tok.id_of("<pad>"));  // ids + attention mask
//
// The steps are those of tokenizers' Tokenizer::encode: the text is split on added tokens (leftmost-longest,
// with their lstrip/rstrip/single_word flags; "normalized" tokens are matched in the normalized text), each
// other piece is normalized, pre-tokenized and run through the model, and the post-processor adds the
// template's special tokens when add_special_tokens is true.
//
// Supported: model BPE (vocab, merges as "a b" strings or [a, b] pairs, ignore_merges, unk_token/fuse_unk,
// no byte_fallback, no dropout, no continuing_subword_prefix/end_of_word_suffix) and Unigram (vocab
// [[piece, score], ...], unk_id or null, byte_fallback; see unigram_model.h); normalizer null, NFC,
// Precompiled (SentencePiece's charsmap, precompiled_charsmap.h), Replace (String or Regex pattern), Strip,
// Sequence; pre_tokenizer null, ByteLevel, Split (Regex or String pattern, all five behaviors, invert),
// WhitespaceSplit, Metaspace (replacement, prepend_scheme always/first/never or the older add_prefix_space,
// split), Sequence; post_processor null, ByteLevel, TemplateProcessing (the single template), Sequence. The
// top-level "truncation" and "padding" settings are ignored (transformers replaces them on every call; use
// encode_padded), as is "decoder". Anything else is a kiln::Error naming the file and the JSON path, e.g.
// "[tokenizer] tokenizer.json: normalizer.normalizers[1].type 'NFKC' is not supported".
// Metaspace's "first" puts its replacement in front of the text that starts the input only; kiln follows that
// offset through added tokens, pre-tokenizer splits and normalizers that delete the text's first characters
// (Strip, Replace by nothing).
// Added-token ids are checked against the ids tokenizers itself assigns (the vocabulary's id, else the next
// free one), so a file the library would renumber is an error rather than a silently different encoding.
//
// Regexes: tokenizers runs Split and Replace patterns with Oniguruma, kiln with PCRE2 (UTF + UCP). \s / \S are rewritten
// to Oniguruma's White_Space (PCRE2 also counts U+180E); \w, \d and \p{...} are PCRE2's, with its Unicode
// version (code points assigned after it are not letters/numbers to kiln).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace kiln::tokenizers {

class HfTokenizer {
 public:
  static HfTokenizer from_file(const std::filesystem::path& path);
  // dir / "tokenizer.json".
  static HfTokenizer from_pretrained(const std::filesystem::path& dir);
  // An already parsed tokenizer.json; `source` names it in errors.
  static HfTokenizer from_json(const nlohmann::json& j, const std::string& source);

  // Token strings of `text` (byte-level symbols such as "Ġcat", added tokens verbatim), before the
  // post-processor.
  std::vector<std::string> tokenize(const std::string& text) const;
  // tokenizer.encode(text, add_special_tokens).ids of the `tokenizers` library. Invalid UTF-8 is an error.
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = true) const;

  struct Padded {
    std::vector<int64_t> ids;             // exactly max_length ids
    std::vector<int64_t> attention_mask;  // 1 on real tokens, 0 on padding
  };
  // transformers' padding="max_length", truncation=True, padding_side="right": the text's ids are cut so
  // that they plus the post-processor's special tokens fit in max_length, then pad_id fills the rest.
  Padded encode_padded(const std::string& text, int64_t max_length, int64_t pad_id,
                       bool add_special_tokens = true) const;

  // token_to_id: added tokens first, then the model vocabulary.
  std::optional<int64_t> id_of(const std::string& token) const;
  // Distinct ids: vocabulary entries plus added tokens outside it (get_vocab_size(with_added_tokens=True)).
  int64_t vocab_size() const;
  // Special tokens the post-processor adds to one sequence when add_special_tokens is true.
  int64_t num_special_tokens_to_add() const;

  struct State;

 private:
  explicit HfTokenizer(std::shared_ptr<const State> s) : s_(std::move(s)) {}
  std::shared_ptr<const State> s_;  // shared by copies; the BPE cache inside is thread-safe
};

}  // namespace kiln::tokenizers
