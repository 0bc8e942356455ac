// CLIP BPE and T5 SentencePiece tokenizers against the ids transformers produced for the
// fixtures' probe strings (manifest.json "tokenizer_probes"), plus the cleanup rules the probes
// do not reach and the error messages for broken tokenizer folders.
#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "golden.h"
#include "test_util.h"
#include "tokenizers/clip_tokenizer.h"
#include "tokenizers/t5_tokenizer.h"

namespace kiln::test {
namespace {
namespace fs = std::filesystem;
using tokenizers::ClipTokenizer;
using tokenizers::T5Tokenizer;

nlohmann::json manifest(const std::string& set) {
  std::ifstream in(fixture(set) / "manifest.json");
  return nlohmann::json::parse(in);
}

std::vector<int64_t> golden_ids(const std::string& set, const std::string& key) {
  return to_int_vector(golden(set, key));
}

// A scratch copy of a fixture's tokenizer folder that a test may break.
struct ScratchFolder {
  fs::path dir;
  ScratchFolder(const std::string& name, const fs::path& copy_from) {
    dir = fs::temp_directory_path() / ("kiln_tok_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(copy_from)) {
      fs::copy_file(e.path(), dir / e.path().filename());
      fs::permissions(dir / e.path().filename(), fs::perms::owner_write, fs::perm_options::add);
    }
  }
  ~ScratchFolder() { fs::remove_all(dir); }
  void write(const std::string& file, const std::string& text) const { std::ofstream(dir / file) << text; }
};

class TokenizerGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerGolden, ClipProbesMatchTransformers) {
  const std::string set = GetParam();
  const auto tok = ClipTokenizer::from_pretrained(pipeline_dir(set) / "tokenizer");
  const auto m = manifest(set);
  ASSERT_FALSE(m["tokenizer_probes"]["tokenizer"].empty());
  for (const auto& probe : m["tokenizer_probes"]["tokenizer"]) {
    const std::string text = probe["text"];
    SCOPED_TRACE("probe " + probe["index"].dump() + ": " + probe["text"].dump());
    EXPECT_EQ(tok.encode(text), golden_ids(set, probe["key"]));
    EXPECT_EQ(tok.encode_padded(text), golden_ids(set, probe["key_padded"]));
    auto tokens = tok.tokenize(text);
    tokens.insert(tokens.begin(), "<|startoftext|>");
    tokens.push_back("<|endoftext|>");
    EXPECT_EQ(tokens, probe["tokens"].get<std::vector<std::string>>());
  }
  const std::string prompt = m["inputs"]["prompt"];
  EXPECT_EQ(tok.encode_padded(prompt), golden_ids(set, "clip.input_ids"));
}

TEST_P(TokenizerGolden, T5ProbesMatchTransformers) {
  const std::string set = GetParam();
  const auto tok = T5Tokenizer::from_pretrained(pipeline_dir(set) / "tokenizer_2");
  const auto m = manifest(set);
  const int64_t max_len = m["inputs"]["max_sequence_length"];
  ASSERT_FALSE(m["tokenizer_probes"]["tokenizer_2"].empty());
  for (const auto& probe : m["tokenizer_probes"]["tokenizer_2"]) {
    const std::string text = probe["text"];
    SCOPED_TRACE("probe " + probe["index"].dump() + ": " + probe["text"].dump());
    EXPECT_EQ(tok.encode(text), golden_ids(set, probe["key"]));
    EXPECT_EQ(tok.encode_padded(text, max_len), golden_ids(set, probe["key_padded"]));
    auto tokens = tok.tokenize(text);
    tokens.push_back("</s>");
    EXPECT_EQ(tokens, probe["tokens"].get<std::vector<std::string>>());
  }
  const std::string prompt = m["inputs"]["prompt"];
  EXPECT_EQ(tok.encode_padded(prompt, max_len), golden_ids(set, "t5.input_ids"));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerGolden, ::testing::Values("flux1_tiny", "flux1_tiny_arch"));

ClipTokenizer tiny_clip() { return ClipTokenizer::from_pretrained(pipeline_dir("flux1_tiny") / "tokenizer"); }
T5Tokenizer tiny_t5() { return T5Tokenizer::from_pretrained(pipeline_dir("flux1_tiny") / "tokenizer_2"); }

TEST(TokenizerClip, SpecialTokensAndLengths) {
  const auto tok = tiny_clip();
  EXPECT_EQ(tok.bos_id(), 998);
  EXPECT_EQ(tok.eos_id(), 999);
  EXPECT_EQ(tok.pad_id(), 999);  // pad_token is <|endoftext|>
  EXPECT_EQ(tok.unk_id(), 999);
  EXPECT_EQ(tok.model_max_length(), 77);
  EXPECT_EQ(tok.vocab_size(), 1000);
  // Truncation keeps bos, the first max_length-2 text ids and eos.
  const auto full = tok.encode("a photo of many many many cats and dogs");
  const auto cut = tok.encode_padded("a photo of many many many cats and dogs", 5);
  EXPECT_EQ(cut, (std::vector<int64_t>{full[0], full[1], full[2], full[3], 999}));
  EXPECT_EQ(tok.encode_padded("", 4), (std::vector<int64_t>{998, 999, 999, 999}));
  expect_error([&] { tok.encode_padded("a photo", 2); }, {"[tokenizer]", "max_length 2"});
}

TEST(TokenizerClip, TextCleanupFollowsTheSlowTokenizer) {
  const auto tok = tiny_clip();
  // Control characters and U+FFFD vanish; tabs, newlines and Unicode spaces separate words.
  EXPECT_EQ(tok.encode("ab\x01\xEF\xBF\xBD"), tok.encode("ab"));
  EXPECT_EQ(tok.encode("a\tb\nc\xC2\xA0" "d\xE3\x80\x80" "e"), tok.encode("a b c d e"));
  // NFC: e + combining acute is é; lowercase covers non-ASCII letters.
  EXPECT_EQ(tok.encode("cafe\xCC\x81"), tok.encode("caf\xC3\xA9"));
  EXPECT_EQ(tok.encode("CAF\xC3\x89 \xCE\xA9"), tok.encode("caf\xC3\xA9 \xCF\x89"));
  // Final sigma: "ΟΔΟΣ" lowers to "οδος" with ς at the end, like str.lower().
  EXPECT_EQ(tok.encode("\xCE\x9F\xCE\x94\xCE\x9F\xCE\xA3"), tok.encode("\xCE\xBF\xCE\xB4\xCE\xBF\xCF\x82"));
  EXPECT_EQ(tok.encode("\xCE\xA3"), tok.encode("\xCF\x83"));
  // U+0345 matches no alternative of the pre-tokenisation regex under IGNORECASE (Python's
  // `regex` module), so it separates words and disappears.
  EXPECT_EQ(tok.encode("a\xCD\x85" "b"), tok.encode("a b"));
  // CJK ideographs become separate words.
  EXPECT_EQ(tok.encode("\xE6\xBC\xA2\xE5\xAD\x97"), tok.encode("\xE6\xBC\xA2 \xE5\xAD\x97"));
  // Special tokens written in the text are kept whole.
  const auto ids = tok.encode("a<|endoftext|>b");
  EXPECT_EQ(ids, (std::vector<int64_t>{998, tok.encode("a")[1], 999, tok.encode("b")[1], 999}));
  expect_error([&] { tok.encode("bad \xC3("); }, {"[tokenizer]", "not valid UTF-8"});
}

TEST(TokenizerClip, ReadsTokenizerJsonWhenVocabAndMergesAreAbsent) {
  ScratchFolder f("clip_json", pipeline_dir("flux1_tiny") / "tokenizer");
  const auto vocab = nlohmann::json::parse(std::ifstream(f.dir / "vocab.json"));
  std::ifstream merges_in(f.dir / "merges.txt");
  std::string line;
  std::getline(merges_in, line);  // "#version" header
  auto merges = nlohmann::json::array();
  for (bool as_pair = false; std::getline(merges_in, line); as_pair = !as_pair) {
    if (line.empty()) continue;
    const auto space = line.find(' ');
    // Both encodings tokenizers has used: "a b" and ["a", "b"].
    if (as_pair) merges.push_back({line.substr(0, space), line.substr(space + 1)});
    else merges.push_back(line);
  }
  f.write("tokenizer.json", nlohmann::json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}}.dump());
  fs::remove(f.dir / "vocab.json");
  fs::remove(f.dir / "merges.txt");
  const auto from_json = ClipTokenizer::from_pretrained(f.dir);
  const auto reference = tiny_clip();
  for (const auto& probe : manifest("flux1_tiny")["tokenizer_probes"]["tokenizer"]) {
    const std::string text = probe["text"];
    EXPECT_EQ(from_json.encode_padded(text), reference.encode_padded(text)) << text;
  }
}

TEST(TokenizerT5, SpecialTokensAndAddedTokens) {
  const auto tok = tiny_t5();
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.pad_id(), 0);
  EXPECT_EQ(tok.unk_id(), 2);
  EXPECT_EQ(tok.model_max_length(), 512);
  EXPECT_EQ(tok.vocab_size(), 1100);
  // <extra_id_k> are added tokens that swallow the spaces around them.
  auto a = tok.encode("a"), b = tok.encode("b");
  std::vector<int64_t> want(a.begin(), a.end() - 1);
  want.push_back(1099);
  want.insert(want.end(), b.begin(), b.end());
  EXPECT_EQ(tok.encode("a <extra_id_0>  b"), want);
  // No second </s> after one written in the text.
  EXPECT_EQ(tok.encode("a</s>"), a);
  EXPECT_EQ(tok.encode_padded("hello", 2), (std::vector<int64_t>{tok.encode("hello")[0], 1}));
  EXPECT_EQ(tok.encode_padded("", 3), (std::vector<int64_t>{1, 0, 0}));
}

TEST(TokenizerT5, NonLegacyModeAgreesOnPlainText) {
  ScratchFolder f("t5_nonlegacy", pipeline_dir("flux1_tiny") / "tokenizer_2");
  auto cfg = nlohmann::json::parse(std::ifstream(f.dir / "tokenizer_config.json"));
  cfg["legacy"] = false;
  f.write("tokenizer_config.json", cfg.dump());
  const auto legacy = tiny_t5();
  const auto modern = T5Tokenizer::from_pretrained(f.dir);
  for (const auto& probe : manifest("flux1_tiny")["tokenizer_probes"]["tokenizer_2"]) {
    const std::string text = probe["text"];
    EXPECT_EQ(modern.encode(text), legacy.encode(text)) << text;
  }
  // Where the two differ: the text after an added token gets no word-start mark.
  EXPECT_NE(modern.encode("a<extra_id_0>hello"), legacy.encode("a<extra_id_0>hello"));
}

TEST(TokenizerErrors, MissingAndMalformedFiles) {
  expect_error([] { ClipTokenizer::from_pretrained("/nonexistent/tokenizer"); },
               {"[tokenizer]", "/nonexistent/tokenizer", "does not exist"});
  expect_error([] { T5Tokenizer::from_pretrained("/nonexistent/tokenizer_2"); },
               {"[tokenizer]", "/nonexistent/tokenizer_2"});
  {
    ScratchFolder f("clip_nomerges", pipeline_dir("flux1_tiny") / "tokenizer");
    fs::remove(f.dir / "merges.txt");
    expect_error([&] { ClipTokenizer::from_pretrained(f.dir); }, {"[tokenizer]", "merges.txt", "not found"});
  }
  {
    ScratchFolder f("clip_novocab", pipeline_dir("flux1_tiny") / "tokenizer");
    fs::remove(f.dir / "vocab.json");
    expect_error([&] { ClipTokenizer::from_pretrained(f.dir); }, {"[tokenizer]", "vocab.json", "not found"});
  }
  {
    ScratchFolder f("clip_empty", pipeline_dir("flux1_tiny") / "tokenizer");
    fs::remove(f.dir / "vocab.json");
    fs::remove(f.dir / "merges.txt");
    expect_error([&] { ClipTokenizer::from_pretrained(f.dir); }, {"[tokenizer]", "no vocab.json + merges.txt"});
  }
  {
    ScratchFolder f("clip_badvocab", pipeline_dir("flux1_tiny") / "tokenizer");
    f.write("vocab.json", "{\"a\": 1, \"b\": ");
    expect_error([&] { ClipTokenizer::from_pretrained(f.dir); }, {"[tokenizer]", "vocab.json", "bad JSON"});
    f.write("vocab.json", "{\"a\": \"one\"}");
    expect_error([&] { ClipTokenizer::from_pretrained(f.dir); }, {"vocab.json", "id of token 'a'", "integer"});
  }
  {
    ScratchFolder f("clip_badmerges", pipeline_dir("flux1_tiny") / "tokenizer");
    f.write("merges.txt", "#version: 0.2\nt h\ni n x\n");
    expect_error([&] { ClipTokenizer::from_pretrained(f.dir); }, {"merges.txt", "line 3", "i n x"});
  }
  {
    ScratchFolder f("clip_nobos", pipeline_dir("flux1_tiny") / "tokenizer");
    f.write("special_tokens_map.json", "{\"bos_token\": \"<|nope|>\"}");
    expect_error([&] { ClipTokenizer::from_pretrained(f.dir); }, {"bos_token '<|nope|>'", "not in the vocabulary"});
  }
  {
    ScratchFolder f("t5_nomodel", pipeline_dir("flux1_tiny") / "tokenizer_2");
    fs::remove(f.dir / "spiece.model");
    expect_error([&] { T5Tokenizer::from_pretrained(f.dir); }, {"[tokenizer]", "spiece.model", "not found"});
  }
  {
    ScratchFolder f("t5_badmodel", pipeline_dir("flux1_tiny") / "tokenizer_2");
    f.write("spiece.model", "this is not a protobuf");
    expect_error([&] { T5Tokenizer::from_pretrained(f.dir); },
                 {"[tokenizer]", "spiece.model", "not a valid SentencePiece model"});
  }
}

}  // namespace
}  // namespace kiln::test
