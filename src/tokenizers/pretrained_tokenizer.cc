#include "tokenizers/pretrained_tokenizer.h"

#include "tokenizers/tokenizer_files.h"

namespace kiln::tokenizers {

TokenizerConfig PretrainedTokenizer::open_folder(const std::filesystem::path& dir, const std::string& what) {
  check_folder(dir, what);
  return TokenizerConfig::load(dir);
}

}  // namespace kiln::tokenizers
