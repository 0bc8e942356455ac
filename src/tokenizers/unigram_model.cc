#include "tokenizers/unigram_model.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "core/error.h"

namespace kiln::tokenizers {
namespace {

// tokenizers' K_UNK_PENALTY: the unk token scores this much below the worst piece.
constexpr double kUnkPenalty = 10.0;

size_t utf8_length(unsigned char lead) { return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

}  // namespace

UnigramModel::UnigramModel(std::vector<Piece> pieces, std::optional<int64_t> unk_id, bool byte_fallback,
                           const std::string& source)
    : source_(source), pieces_(std::move(pieces)), unk_(unk_id), byte_fallback_(byte_fallback) {
  if (unk_) {
    KILN_CHECK(!pieces_.empty(), "tokenizer", source_, ": model.vocab is empty but model.unk_id is set");
    KILN_CHECK(*unk_ >= 0 && *unk_ < int64_t(pieces_.size()), "tokenizer", source_, ": model.unk_id ", *unk_,
               " is outside model.vocab (", pieces_.size(), " pieces)");
  }
  double min_score = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < pieces_.size(); ++i) {
    ids_.insert_or_assign(pieces_[i].text, int64_t(i));
    min_score = std::min(min_score, pieces_[i].score);
  }
  unk_score_ = min_score - kUnkPenalty;
  node_id_.push_back(-1);
  for (const auto& [text, id] : ids_) {
    uint32_t node = 0;
    for (char c : text) {
      const uint64_t key = (uint64_t(node) << 8) | static_cast<unsigned char>(c);
      auto it = children_.find(key);
      if (it == children_.end()) {
        it = children_.emplace(key, uint32_t(node_id_.size())).first;
        node_id_.push_back(-1);
      }
      node = it->second;
    }
    if (node != 0) node_id_[node] = id;  // an empty piece never matches (tokenizers' trie skips the root)
  }
}

std::optional<int64_t> UnigramModel::id_of(const std::string& text) const {
  const auto it = ids_.find(text);
  return it == ids_.end() ? std::nullopt : std::optional<int64_t>(it->second);
}

std::vector<std::string_view> UnigramModel::segment(std::string_view word) const {
  struct Best {
    int64_t id = 0;
    double score = 0.0;
    int64_t start = -1;  // -1: no path ends here yet
  };
  const size_t size = word.size();
  std::vector<Best> best(size + 1);
  for (size_t start = 0; start < size;) {
    const double base = best[start].score;
    const size_t char_len = std::min(utf8_length(static_cast<unsigned char>(word[start])), size - start);
    bool has_single = false;
    uint32_t node = 0;
    for (size_t end = start; end < size; ++end) {
      const auto it = children_.find((uint64_t(node) << 8) | static_cast<unsigned char>(word[end]));
      if (it == children_.end()) break;
      node = it->second;
      const int64_t id = node_id_[node];
      if (id < 0) continue;
      Best& target = best[end + 1];
      const double candidate = base + pieces_[size_t(id)].score;
      if (target.start < 0 || candidate > target.score) target = {id, candidate, int64_t(start)};
      if (end + 1 - start == char_len) has_single = true;
    }
    if (!has_single) {
      Best& target = best[start + char_len];
      const double candidate = base + unk_score_;
      if (target.start < 0 || candidate > target.score) {
        KILN_CHECK(unk_.has_value(), "tokenizer", source_, ": '", std::string(word.substr(start, char_len)),
                   "' is not in the Unigram vocabulary and model.unk_id is null");
        target = {*unk_, candidate, int64_t(start)};
      }
    }
    start += char_len;
  }
  // Back from the end; runs of unk ids become one token (fuse_unk).
  std::vector<std::string_view> out;
  size_t unk_begin = size, unk_end = size;  // the pending unk run, empty when unk_begin == unk_end
  for (size_t end = size; end > 0;) {
    const Best& node = best[end];
    const size_t start = size_t(node.start);
    if (unk_ && node.id == *unk_) {
      if (unk_begin == unk_end) unk_end = end;
      unk_begin = start;
    } else {
      if (unk_begin != unk_end) out.push_back(word.substr(unk_begin, unk_end - unk_begin));
      unk_begin = unk_end = size;
      out.push_back(word.substr(start, end - start));
    }
    end = start;
  }
  if (unk_begin != unk_end) out.push_back(word.substr(unk_begin, unk_end - unk_begin));
  std::reverse(out.begin(), out.end());
  return out;
}

void UnigramModel::encode(std::string_view word, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  for (const std::string_view token : segment(word)) {
    if (const auto it = ids_.find(std::string(token)); it != ids_.end()) {
      out.push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      std::vector<int64_t> bytes;
      for (char c : token) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", static_cast<unsigned char>(c));
        const auto it = ids_.find(name);
        if (it == ids_.end()) break;
        bytes.push_back(it->second);
      }
      if (bytes.size() == token.size()) {
        out.insert(out.end(), bytes.begin(), bytes.end());
        continue;
      }
    }
    KILN_CHECK(unk_.has_value(), "tokenizer", source_, ": '", std::string(token),
               "' is not in the Unigram vocabulary and model.unk_id is null");
    out.push_back(*unk_);
  }
}

}  // namespace kiln::tokenizers
