#include "tokenizers/t5_tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <set>
#include <unordered_map>

#include "core/error.h"
#include "tokenizers/tokenizer_files.h"

namespace kiln::tokenizers {
namespace fs = std::filesystem;

namespace {
const std::string kSpieceUnderline = "\xE2\x96\x81";  // U+2581, SentencePiece's word-start mark

// One token: its id and its text (a piece or an added token's content).
struct Token {
  int64_t id;
  std::string text;
  bool added;
};

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
  return s;
}
}  // namespace

struct T5Tokenizer::State {
  fs::path dir;
  sentencepiece::SentencePieceProcessor sp;
  std::vector<AddedToken> added;
  std::set<std::string> all_special;  // eos, unk, pad and additional_special_tokens
  int64_t eos = -1, pad = -1, unk = -1, max_length = 512;
  // transformers' non-legacy T5Tokenizer (legacy=false): the model runs without the dummy
  // prefix and a piece that starts with a space is encoded behind "<unk>", which is then cut.
  bool legacy = true, add_prefix_space = true;
  std::string unk_token = "<unk>";
  size_t unk_token_length = 0;

  std::vector<Token> sp_encode(const std::string& text) const {
    std::vector<int> ids;
    const auto status = sp.Encode(text, &ids);
    KILN_CHECK(status.ok(), "tokenizer", "SentencePiece cannot encode text: ", status.ToString());
    std::vector<Token> out;
    for (int id : ids) out.push_back({id, sp.IdToPiece(id), false});
    return out;
  }
  std::vector<Token> tokens(const std::string& text) const;
};

std::vector<Token> T5Tokenizer::State::tokens(const std::string& raw) const {
  std::string text = raw;
  const bool non_legacy = !legacy && !text.empty();
  if (non_legacy) {
    text = replace_all(text, kSpieceUnderline, " ");
    if (add_prefix_space) text = kSpieceUnderline + text;
  }
  std::vector<Token> out;
  for (const auto& seg : split_on_added_tokens(text, added)) {
    if (seg.id >= 0) {
      out.push_back({seg.id, seg.text, true});
      continue;
    }
    if (!non_legacy || !(starts_with(seg.text, kSpieceUnderline) || starts_with(seg.text, " "))) {
      for (auto& t : sp_encode(seg.text)) out.push_back(std::move(t));
    } else {
      auto t = sp_encode(unk_token + seg.text);
      const size_t skip = t.size() >= unk_token_length ? unk_token_length : 0;
      out.insert(out.end(), std::make_move_iterator(t.begin() + skip), std::make_move_iterator(t.end()));
    }
  }
  if (non_legacy && out.size() > 1 && !out[0].added && out[0].text == kSpieceUnderline &&
      all_special.count(out[1].text))
    out.erase(out.begin());
  return out;
}

T5Tokenizer T5Tokenizer::from_pretrained(const fs::path& dir) {
  check_folder(dir, "T5 tokenizer");
  auto s = std::make_shared<State>();
  s->dir = dir;
  const auto config = TokenizerConfig::load(dir);
  const fs::path model_path = dir / "spiece.model";
  std::error_code ec;
  if (!fs::exists(model_path, ec) && fs::exists(dir / "tokenizer.json", ec))
    fail("tokenizer", model_path.string(), ": SentencePiece model not found (the folder has only tokenizer.json; ",
         "kiln's T5 tokenizer needs spiece.model)");
  std::string model = read_file(model_path, "SentencePiece model (spiece.model)");

  // legacy only matters to the slow T5Tokenizer; T5TokenizerFast reads tokenizer.json, which
  // behaves like the legacy path.
  const bool slow_class = json_string(config.config, "tokenizer_class", "T5Tokenizer") == "T5Tokenizer";
  s->legacy = !slow_class || json_flag(config.config, "legacy", true);
  s->add_prefix_space = json_flag(config.config, "add_prefix_space", true);
  if (!s->legacy) {
    // transformers merges NormalizerSpec{add_dummy_prefix: false} into the model proto; appending
    // the serialized field (ModelProto.normalizer_spec = 3 { add_dummy_prefix = 3: 0 }) merges the same.
    model += std::string("\x1A\x02\x18\x00", 4);
  }
  const auto status = s->sp.LoadFromSerializedProto(model);
  KILN_CHECK(status.ok(), "tokenizer", model_path.string(), ": not a valid SentencePiece model (",
             status.ToString(), ")");
  const int64_t n_pieces = s->sp.GetPieceSize();

  s->added = config.added_tokens();
  if (s->added.empty()) {
    // No added-token list: T5Tokenizer's defaults, <extra_id_k> = n_pieces - 1 + extra_ids - k.
    const auto it = config.config.find("extra_ids");
    const int64_t extra = it != config.config.end() && it->is_number_integer() ? it->get<int64_t>() : 100;
    for (int64_t k = 0; k < extra; ++k)
      s->added.push_back({"<extra_id_" + std::to_string(k) + ">", n_pieces - 1 + extra - k, true, true});
  }
  std::unordered_map<std::string, int64_t> added_ids;
  for (const auto& t : s->added) added_ids.insert_or_assign(t.content, t.id);
  for (const auto& t : s->added)
    if (starts_with(t.content, "<extra_id_")) s->all_special.insert(t.content);
  if (const auto it = config.config.find("additional_special_tokens"); it != config.config.end() && it->is_array())
    for (const auto& t : *it)
      if (t.is_string()) s->all_special.insert(t.get<std::string>());

  auto special = [&](const char* key, const char* fallback) {
    const std::string text = config.special_token(key).value_or(fallback);
    int64_t id = -1;
    if (auto it = added_ids.find(text); it != added_ids.end()) {
      id = it->second;
    } else {
      const int piece = s->sp.PieceToId(text);
      if (s->sp.IdToPiece(piece) == text) id = piece;
      s->added.push_back({text, id});  // special tokens are never split
      added_ids.emplace(text, id);
    }
    KILN_CHECK(id >= 0, "tokenizer", dir.string(), ": ", key, " '", text, "' is neither an added token nor a piece of ",
               model_path.string());
    s->all_special.insert(text);
    return id;
  };
  s->eos = special("eos_token", "</s>");
  s->unk = special("unk_token", "<unk>");
  s->pad = special("pad_token", "<pad>");
  s->unk_token = config.special_token("unk_token").value_or("<unk>");
  s->unk_token_length = s->sp_encode(s->unk_token).size();
  s->max_length = config.model_max_length(512);
  return T5Tokenizer(std::move(s));
}

std::vector<std::string> T5Tokenizer::tokenize(const std::string& text) const {
  std::vector<std::string> out;
  for (auto& t : s_->tokens(text)) out.push_back(std::move(t.text));
  return out;
}

std::vector<int64_t> T5Tokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  for (const auto& t : s_->tokens(text)) ids.push_back(t.id);
  // T5Tokenizer._add_eos_if_not_present: no second </s> after one written in the text.
  if (ids.empty() || ids.back() != s_->eos) ids.push_back(s_->eos);
  return ids;
}

std::vector<int64_t> T5Tokenizer::encode_padded(const std::string& text, int64_t max_length) const {
  KILN_CHECK(max_length >= 1, "tokenizer", "T5 max_length must be positive, got ", max_length);
  std::vector<int64_t> ids;
  for (const auto& t : s_->tokens(text)) ids.push_back(t.id);
  if (int64_t(ids.size()) + 1 > max_length) {
    // transformers cannot truncate when </s> alone fills max_length; refuse instead.
    KILN_CHECK(max_length > 1, "tokenizer", "T5 max_length ", max_length, " leaves no room for text tokens");
    ids.resize(size_t(max_length - 1));
  }
  if (ids.empty() || ids.back() != s_->eos) ids.push_back(s_->eos);
  ids.resize(size_t(max_length), s_->pad);
  return ids;
}

int64_t T5Tokenizer::model_max_length() const { return s_->max_length; }
int64_t T5Tokenizer::eos_id() const { return s_->eos; }
int64_t T5Tokenizer::pad_id() const { return s_->pad; }
int64_t T5Tokenizer::unk_id() const { return s_->unk; }
int64_t T5Tokenizer::vocab_size() const {
  int64_t n = s_->sp.GetPieceSize();
  for (const auto& t : s_->added) n = std::max(n, t.id + 1);
  return n;
}

}  // namespace kiln::tokenizers
