// What transformers' slow SentencePiece tokenizers share (T5Tokenizer, and LlamaTokenizer whose
// tokenize/_tokenize are copied from it): a SentencePiece model plus the added tokens kept outside
// it, and the tokenize() rules of both modes:
//
//  - legacy: the text is split on added tokens and each other piece goes through SentencePiece as
//    the model file configures it (dummy prefix included).
//  - non-legacy (legacy=false): the model runs without its dummy prefix; "▁" in the text becomes a
//    space, one "▁" is put in front of the whole text (add_prefix_space), a piece that starts with a
//    space is encoded behind the unk token which is then cut off (so the prefix is not lost), and a
//    lone leading "▁" in front of a special token is dropped.
//
// Token strings map to ids as transformers' convert_tokens_to_ids does: added tokens first, then the
// model's pieces.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizers/tokenizer_files.h"

namespace kiln::tokenizers {

struct SpToken {
  int64_t id;
  std::string text;  // the piece ("▁cat", "<0x09>") or the added token's content
  bool added;
};

class SlowSentencePiece {
 public:
  // Reads the SentencePiece model at `path` (`what` names it in errors). legacy=false loads it with
  // add_dummy_prefix off, as transformers' get_spm_processor does.
  SlowSentencePiece(const std::filesystem::path& path, const std::string& what, bool legacy, bool add_prefix_space);

  int64_t piece_size() const;
  // len(tokenizer): the pieces plus the added tokens whose ids lie beyond them.
  int64_t vocab_size() const;
  // The id of `piece` when it is exactly a piece of the model.
  std::optional<int64_t> piece_id(const std::string& piece) const;
  std::string id_to_piece(int64_t id) const;
  // SentencePiece's own encoding of `text` (no added-token split, no prefix rules).
  std::vector<SpToken> sp_encode(const std::string& text) const;

  // Added tokens (never split by SentencePiece); later entries with the same content win.
  void add_token(AddedToken token);
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  std::optional<int64_t> added_id(const std::string& content) const;
  // transformers' _add_tokens for a special token: an already added token keeps its id, else the
  // model's piece of that text becomes a no-split token; nullopt when it is neither (transformers
  // would give it a new id past the vocabulary, which kiln does not do).
  std::optional<int64_t> add_special_token(const std::string& content);
  // all_special_tokens: the texts the leading-"▁" rule looks at.
  void mark_special(const std::string& content) { all_special_.insert(content); }
  // The unk token the non-legacy rule encodes in front of a piece; call after the model is loaded.
  void set_unk_token(const std::string& unk_token);

  bool legacy() const { return legacy_; }
  // PreTrainedTokenizer.tokenize with the T5/Llama overrides (see the top of this file).
  std::vector<SpToken> tokenize(const std::string& text) const;

 private:
  struct Model;
  std::filesystem::path path_;
  std::shared_ptr<const Model> model_;
  std::vector<AddedToken> added_;
  std::unordered_map<std::string, int64_t> added_ids_;
  std::set<std::string> all_special_;
  bool legacy_ = true, add_prefix_space_ = true;
  std::string unk_token_ = "<unk>";
  size_t unk_token_length_ = 0;
};

}  // namespace kiln::tokenizers
