// The Unigram model of tokenizer.json files (SentencePiece models converted by transformers: T5, ...), run
// as the `tokenizers` library runs it (models/unigram/model.rs, encode_optimized):
//
//   UnigramModel m(pieces, /*unk_id=*/2, /*byte_fallback=*/false, "tokenizer.json");
//   std::vector<int64_t> ids;
//   m.encode("\xE2\x96\x81hello", ids);  // one pre-tokenized word
//
// Viterbi over the pieces' scores (log probabilities): at each character start, every piece that is a prefix
// of the rest of the word extends the best path ending there; a character that no single-character piece
// covers may also be the unk token, scored min_score - 10. Ties keep the earlier start. Consecutive unk
// characters are fused into one token (tokenizers always fuses), whose text is then looked up like any
// other: a fused text that is a piece gets that piece's id, otherwise the bytes' <0xNN> pieces when
// byte_fallback is set and all of them exist, otherwise unk_id.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kiln::tokenizers {

class UnigramModel {
 public:
  struct Piece {
    std::string text;
    double score = 0.0;
  };

  // Ids are the pieces' indices; a text listed twice maps to its last index (as tokenizers' token_to_ids).
  // unk_id must index `pieces` when given. Errors name `source`.
  UnigramModel(std::vector<Piece> pieces, std::optional<int64_t> unk_id, bool byte_fallback,
               const std::string& source);

  // Appends the ids of `word`. A character that only the unk token could cover is an error when there is
  // no unk_id (tokenizers' "Encountered an unknown token but `unk_id` is missing").
  void encode(std::string_view word, std::vector<int64_t>& out) const;

  std::optional<int64_t> id_of(const std::string& text) const;
  const std::vector<Piece>& pieces() const { return pieces_; }

 private:
  // The token texts of the best segmentation, unk runs fused.
  std::vector<std::string_view> segment(std::string_view word) const;

  std::string source_;
  std::vector<Piece> pieces_;
  std::unordered_map<std::string, int64_t> ids_;
  std::optional<int64_t> unk_;
  bool byte_fallback_ = false;
  double unk_score_ = 0.0;
  // A byte trie of the pieces: node -> id of the piece ending there (-1: none); (node << 8 | byte) -> child.
  std::vector<int64_t> node_id_;
  std::unordered_map<uint64_t, uint32_t> children_;
};

}  // namespace kiln::tokenizers
