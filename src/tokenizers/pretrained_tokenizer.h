// What the tokenizer classes (ClipTokenizer, T5Tokenizer, LlamaTokenizer, PromptTokenizer) share, as
// transformers' PreTrainedTokenizerBase holds it for its classes: each is a cheap-to-copy handle on the
// immutable state its from_pretrained read from a Hugging Face tokenizer folder, and the calls every class
// answers alike (tokenize, encode, vocab_size) are declared once here and run by that state.
//
// A class's own state derives from PretrainedTokenizer::State in its .cc, so the headers name no state type
// and a copy (also one taken as a PretrainedTokenizer) keeps the class's behaviour.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kiln::tokenizers {

struct TokenizerConfig;

class PretrainedTokenizer {
 public:
  // Token strings of `text` (the model's pieces, added tokens verbatim), without the special tokens
  // add_special_tokens puts around it.
  std::vector<std::string> tokenize(const std::string& text) const { return s_->tokenize(text); }
  // tokenizer(text, add_special_tokens=...).input_ids, untruncated; which special tokens are added is the
  // class's (see its header).
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = true) const {
    return s_->encode(text, add_special_tokens);
  }
  // len(tokenizer): the model's vocabulary plus the added tokens outside it.
  int64_t vocab_size() const { return s_->vocab_size(); }
  // The folder from_pretrained read.
  const std::filesystem::path& dir() const { return s_->dir; }

  // What from_pretrained read that every class has; a class's own state derives from it and runs the calls above.
  struct State {
    std::filesystem::path dir;
    // The special tokens' ids; nullopt where neither the folder nor the class's defaults name one.
    std::optional<int64_t> bos, eos, unk, pad;
    // tokenizer_config.json's model_max_length, else the class's default; nullopt when there is no limit.
    std::optional<int64_t> max_length;

    virtual ~State() = default;
    virtual std::vector<std::string> tokenize(const std::string& text) const = 0;
    virtual std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const = 0;
    virtual int64_t vocab_size() const = 0;
  };

 protected:
  explicit PretrainedTokenizer(std::shared_ptr<const State> s) : s_(std::move(s)) {}

  // What every from_pretrained starts with: `dir` must be a folder (errors name `what` it holds), and its
  // tokenizer_config.json / special_tokens_map.json.
  static TokenizerConfig open_folder(const std::filesystem::path& dir, const std::string& what);

  // The class's own state S, the one its from_pretrained made.
  template <class S>
  const S& state() const {
    return static_cast<const S&>(*s_);
  }

  std::shared_ptr<const State> s_;  // shared by copies
};

// The slow CLIP and T5 tokenizers (transformers' CLIPTokenizer, T5Tokenizer) always have their special tokens
// and a length: the class's defaults name what the folder does not, and from_pretrained refuses a special token
// that is not a token of the model.
class RequiredSpecialsTokenizer : public PretrainedTokenizer {
 public:
  // tokenizer_config.json's model_max_length, else the class's default.
  int64_t model_max_length() const { return *s_->max_length; }
  int64_t eos_id() const { return *s_->eos; }
  int64_t pad_id() const { return *s_->pad; }
  int64_t unk_id() const { return *s_->unk; }

 protected:
  using PretrainedTokenizer::PretrainedTokenizer;
};

}  // namespace kiln::tokenizers
