#include "tokenizers/sentencepiece_slow.h"

#include <algorithm>

#include <sentencepiece_processor.h>

#include "core/error.h"

namespace kiln::tokenizers {
namespace fs = std::filesystem;

namespace {
const std::string kSpieceUnderline = "\xE2\x96\x81";  // U+2581, SentencePiece's word-start mark

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
  return s;
}
}  // namespace

struct SlowSentencePiece::Model {
  sentencepiece::SentencePieceProcessor sp;
};

SlowSentencePiece::SlowSentencePiece(const fs::path& path, const std::string& what, bool legacy,
                                     bool add_prefix_space)
    : path_(path), legacy_(legacy), add_prefix_space_(add_prefix_space) {
  std::string bytes = read_file(path, what);
  if (!legacy) {
    // transformers merges NormalizerSpec{add_dummy_prefix: false} into the model proto; appending
    // the serialized field (ModelProto.normalizer_spec = 3 { add_dummy_prefix = 3: 0 }) merges the same.
    bytes += std::string("\x1A\x02\x18\x00", 4);
  }
  auto m = std::make_shared<Model>();
  const auto status = m->sp.LoadFromSerializedProto(bytes);
  KILN_CHECK(status.ok(), "tokenizer", path.string(), ": not a valid SentencePiece model (", status.ToString(), ")");
  model_ = std::move(m);
}

int64_t SlowSentencePiece::piece_size() const { return model_->sp.GetPieceSize(); }

int64_t SlowSentencePiece::vocab_size() const {
  int64_t n = piece_size();
  for (const auto& t : added_) n = std::max(n, t.id + 1);
  return n;
}

std::optional<int64_t> SlowSentencePiece::piece_id(const std::string& piece) const {
  const int id = model_->sp.PieceToId(piece);
  if (id >= 0 && id < model_->sp.GetPieceSize() && model_->sp.IdToPiece(id) == piece) return id;
  return std::nullopt;
}

std::string SlowSentencePiece::id_to_piece(int64_t id) const {
  KILN_CHECK(id >= 0 && id < piece_size(), "tokenizer", path_.string(), ": id ", id, " is not a piece of the model (",
             piece_size(), " pieces)");
  return model_->sp.IdToPiece(int(id));
}

std::vector<SpToken> SlowSentencePiece::sp_encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = model_->sp.Encode(text, &ids);
  KILN_CHECK(status.ok(), "tokenizer", path_.string(), ": SentencePiece cannot encode text: ", status.ToString());
  std::vector<SpToken> out;
  out.reserve(ids.size());
  for (int id : ids) {
    // The token string is the piece (an unknown character is "<unk>", as in the Python wrapper), and
    // convert_tokens_to_ids looks it up among the added tokens first.
    std::string piece = model_->sp.IdToPiece(id);
    const auto added = added_ids_.find(piece);
    out.push_back({added != added_ids_.end() ? added->second : id, std::move(piece), false});
  }
  return out;
}

void SlowSentencePiece::add_token(AddedToken token) {
  added_ids_.insert_or_assign(token.content, token.id);
  added_.push_back(std::move(token));
}

std::optional<int64_t> SlowSentencePiece::added_id(const std::string& content) const {
  const auto it = added_ids_.find(content);
  if (it == added_ids_.end()) return std::nullopt;
  return it->second;
}

std::optional<int64_t> SlowSentencePiece::add_special_token(const std::string& content) {
  if (auto id = added_id(content)) return id;
  const auto id = piece_id(content);
  if (id) add_token({content, *id});
  return id;
}

void SlowSentencePiece::set_unk_token(const std::string& unk_token) {
  unk_token_ = unk_token;
  unk_token_length_ = sp_encode(unk_token).size();
}

std::vector<SpToken> SlowSentencePiece::tokenize(const std::string& raw) const {
  std::string text = raw;
  const bool non_legacy = !legacy_ && !text.empty();
  if (non_legacy) {
    text = replace_all(text, kSpieceUnderline, " ");
    if (add_prefix_space_) text = kSpieceUnderline + text;
  }
  std::vector<SpToken> out;
  for (const auto& seg : split_on_added_tokens(text, added_)) {
    if (seg.id >= 0) {
      out.push_back({seg.id, seg.text, true});
      continue;
    }
    if (!non_legacy || !(starts_with(seg.text, kSpieceUnderline) || starts_with(seg.text, " "))) {
      for (auto& t : sp_encode(seg.text)) out.push_back(std::move(t));
    } else {
      // "<unk>" + text keeps SentencePiece from dropping the leading "▁"; the unk pieces are cut.
      auto t = sp_encode(unk_token_ + seg.text);
      const size_t skip = t.size() >= unk_token_length_ ? unk_token_length_ : 0;
      out.insert(out.end(), std::make_move_iterator(t.begin() + long(skip)), std::make_move_iterator(t.end()));
    }
  }
  if (non_legacy && out.size() > 1 && out[0].text == kSpieceUnderline && all_special_.count(out[1].text))
    out.erase(out.begin());
  return out;
}

}  // namespace kiln::tokenizers
