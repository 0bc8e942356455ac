// T5 tokenizer folders with only tokenizer.json (no spiece.model), as some FLUX.1 / SD3 re-uploads carry them:
// kiln's tokenizer.json reader (Unigram, Precompiled charsmap, Replace/Strip, WhitespaceSplit/Metaspace) against
// transformers' T5TokenizerFast and the `tokenizers` library. Fixtures: tests/fixtures/t5_tokenizer_json/ from
// tests/fixtures/generate/t5_tokenizer_json.py (the repository's tiny T5 spiece.model, converted).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "call_args.h"
#include "core/error.h"
#include "golden.h"
#include "pipelines/flux_pipeline.h"
#include "test_util.h"
#include "tokenizers/grapheme_clusters.h"
#include "tokenizers/hf_tokenizer.h"
#include "tokenizers/t5_tokenizer.h"
#include "tokenizers/tokenizer_files.h"

namespace kiln {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using tokenizers::HfTokenizer;
using tokenizers::T5Tokenizer;

fs::path dir() { return test::fixture("t5_tokenizer_json"); }
fs::path spiece_dir() { return test::pipeline_dir("flux1_tiny") / "tokenizer_2"; }

const json& probes() {
  static const json j = tokenizers::read_json(dir() / "probes.json", "probes");
  return j;
}
std::vector<std::string> texts() { return probes()["probes"].get<std::vector<std::string>>(); }
json base_json() { return tokenizers::read_json(dir() / "tokenizer.json", "tokenizer.json"); }

std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out.size() > 60 ? out.substr(0, 60) + "..." : out;
}

// A temporary folder, removed on scope exit.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("kiln_t5json_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

void write_json(const fs::path& path, const json& j) { std::ofstream(path) << j.dump(); }

// The generator's apply(): top-level keys replaced, "model" keys merged; "PRECOMPILED" is the base file's
// Precompiled normalizer and "VOCAB_WITH_BYTES" its vocabulary plus the 256 <0xNN> pieces.
json variant_json(const std::string& name) {
  const json base = base_json();
  const json precompiled = base["normalizer"]["normalizers"][0];
  json bytes_vocab = base["model"]["vocab"];
  for (int b = 0; b < 256; ++b) {
    char piece[8];
    std::snprintf(piece, sizeof(piece), "<0x%02X>", b);
    bytes_vocab.push_back(json::array({piece, -30.0}));
  }
  std::function<json(const json&)> resolve = [&](const json& v) -> json {
    if (v == "PRECOMPILED") return precompiled;
    if (v == "VOCAB_WITH_BYTES") return bytes_vocab;
    if (v.is_object()) {
      json out = json::object();
      for (const auto& [k, x] : v.items()) out[k] = resolve(x);
      return out;
    }
    if (v.is_array()) {
      json out = json::array();
      for (const auto& x : v) out.push_back(resolve(x));
      return out;
    }
    return v;
  };
  const json variants = tokenizers::read_json(dir() / "variants.json", "variants");
  for (const auto& v : variants) {
    if (v["name"] != name) continue;
    json out = base;
    for (const auto& [key, value] : v["overrides"].items()) {
      if (key == "model") {
        for (const auto& [k, x] : value.items()) out["model"][k] = resolve(x);
      } else {
        out[key] = resolve(value);
      }
    }
    return out;
  }
  throw std::runtime_error("no variant " + name);
}

// Every probe's ids through `encode`, exactly as `want` (one list per probe).
template <typename Encode>
void expect_probes(const std::string& what, const json& want, Encode encode) {
  const auto t = texts();
  ASSERT_EQ(want.size(), t.size()) << what;
  size_t exact = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const auto expected = want[i].get<std::vector<int64_t>>();
    const auto got = encode(t[i]);
    if (got == expected) {
      ++exact;
      continue;
    }
    ADD_FAILURE() << what << " probe " << i << " \"" << printable(t[i]) << "\": got "
                  << ::testing::PrintToString(got) << ", want " << ::testing::PrintToString(expected);
  }
  std::printf("[ T5TokenizerJson ] %s: %zu/%zu probes exact\n", what.c_str(), exact, t.size());
}

TEST(T5TokenizerJson, ProbesMatchT5TokenizerFast) {
  const T5Tokenizer t5 = T5Tokenizer::from_pretrained(dir());
  expect_probes("T5Tokenizer(tokenizer.json only)", probes()["ids"], [&](const std::string& s) { return t5.encode(s); });
  const HfTokenizer hf = HfTokenizer::from_pretrained(dir());
  expect_probes("HfTokenizer", probes()["ids"], [&](const std::string& s) { return hf.encode(s); });
}

TEST(T5TokenizerJson, PaddedEncodingsMatchT5TokenizerFast) {
  const T5Tokenizer t5 = T5Tokenizer::from_pretrained(dir());
  for (const auto& [length, want] : probes()["padded"].items()) {
    const int64_t n = std::stoll(length);
    expect_probes("encode_padded(" + length + ")", want, [&](const std::string& s) { return t5.encode_padded(s, n); });
  }
}

TEST(T5TokenizerJson, SpecialIdsAndSettings) {
  const T5Tokenizer t5 = T5Tokenizer::from_pretrained(dir());
  const T5Tokenizer slow = T5Tokenizer::from_pretrained(spiece_dir());
  EXPECT_EQ(t5.eos_id(), 1);
  EXPECT_EQ(t5.pad_id(), 0);
  EXPECT_EQ(t5.unk_id(), 2);
  EXPECT_EQ(t5.vocab_size(), 1100);  // 1000 pieces + 100 <extra_id_k>
  EXPECT_EQ(t5.vocab_size(), slow.vocab_size());
  EXPECT_EQ(t5.model_max_length(), 512);
  EXPECT_EQ(t5.tokenize("A painting of a squirrel"), slow.tokenize("A painting of a squirrel"));
  const auto tokens = t5.tokenize("<extra_id_0> hello");
  ASSERT_FALSE(tokens.empty());
  EXPECT_EQ(tokens.front(), "<extra_id_0>");
}

// The spiece.model folder (SentencePiece, the slow T5Tokenizer's rules) and the tokenizer.json-only folder give
// the same ids wherever transformers' slow and fast tokenizers agree. They disagree on two probes: a text
// ending in "</s>" (the fast one appends a second </s>) and U+0085 (a word break to the fast one's
// WhitespaceSplit, an unknown character to SentencePiece).
TEST(T5TokenizerJson, SameIdsAsTheSpieceModelFolderWhereSlowAndFastAgree) {
  const T5Tokenizer fast = T5Tokenizer::from_pretrained(dir());
  const T5Tokenizer slow = T5Tokenizer::from_pretrained(spiece_dir());
  const auto t = texts();
  const json& fast_ids = probes()["ids"];
  const json& slow_ids = probes()["slow_ids"];
  expect_probes("T5Tokenizer(spiece.model) vs slow reference", slow_ids,
                [&](const std::string& s) { return slow.encode(s); });
  std::set<std::string> differ;
  for (size_t i = 0; i < t.size(); ++i) {
    if (fast_ids[i] != slow_ids[i]) {
      differ.insert(t[i]);
      continue;
    }
    EXPECT_EQ(fast.encode(t[i]), slow.encode(t[i])) << "probe " << i << " \"" << printable(t[i]) << "\"";
    EXPECT_EQ(fast.encode_padded(t[i], 48), slow.encode_padded(t[i], 48)) << "probe " << i;
  }
  EXPECT_EQ(differ, (std::set<std::string>{"ends with </s>", "control\x01\x7f chars\xC2\x85"}));
}

// Reader settings T5's own file does not use, against the tokenizers library (variants.json).
TEST(T5TokenizerJson, NormalizerAndPreTokenizerVariantsMatchTokenizers) {
  for (const auto& [name, want] : probes()["variants"].items()) {
    const HfTokenizer tok = HfTokenizer::from_json(variant_json(name), name);
    expect_probes(name, want, [&](const std::string& s) { return tok.encode(s); });
  }
}

TEST(T5TokenizerJson, FluxPipelineWithOnlyTokenizerJsonGivesTheBundledImage) {
  TempDir tmp("flux1");
  const fs::path pipe_dir = tmp.path / "pipeline";
  fs::copy(test::pipeline_dir("flux1_tiny"), pipe_dir, fs::copy_options::recursive);
  fs::remove_all(pipe_dir / "tokenizer_2");
  fs::create_directories(pipe_dir / "tokenizer_2");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
    fs::copy_file(dir() / f, pipe_dir / "tokenizer_2" / f);

  PipelineCallArgs args = test::fixture_call_args("flux1_tiny");
  args.latents = test::golden("flux1_tiny", "latents.initial_packed");
  const PipelineOutput bundled = FluxPipeline::from_pretrained(test::pipeline_dir("flux1_tiny"))(args);
  const PipelineOutput json_only = FluxPipeline::from_pretrained(pipe_dir)(args);
  EXPECT_EQ(json_only.image, bundled.image);  // the same T5 ids, so the same bytes
  EXPECT_LE(test::byte_diff(json_only.image, test::golden_u8("flux1_tiny", "image.uint8")).second, 1);
}

// The clusters the Precompiled normalizer walks (UAX #29 on Unicode 16.0, as tokenizers' unicode-segmentation).
TEST(T5TokenizerJson, GraphemeClustersFollowUax29) {
  using Spans = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(tokenizers::grapheme_clusters(""), Spans{});
  EXPECT_EQ(tokenizers::grapheme_clusters("e\u0301\r\n"), (Spans{{0, 3}, {3, 5}}));                 // GB9, GB3
  EXPECT_EQ(tokenizers::grapheme_clusters("\x01\u0301"), (Spans{{0, 1}, {1, 3}}));                    // GB4
  EXPECT_EQ(tokenizers::grapheme_clusters("\U0001f1eb\U0001f1f7\U0001f1e9"), (Spans{{0, 8}, {8, 12}}));  // GB12/13
  EXPECT_EQ(tokenizers::grapheme_clusters("\U0001f431\u200d\U0001f464"), (Spans{{0, 11}}));          // GB11
  EXPECT_EQ(tokenizers::grapheme_clusters("\u2122\u0308\u2764\ufe0f"), (Spans{{0, 5}, {5, 11}}));   // no ZWJ
  EXPECT_EQ(tokenizers::grapheme_clusters("\u1100\u1161\u11a8\uac00\u11a8"), (Spans{{0, 9}, {9, 15}}));  // GB6-8
  EXPECT_EQ(tokenizers::grapheme_clusters("\u0915\u094d\u0937a"), (Spans{{0, 9}, {9, 10}}));         // GB9c
  EXPECT_EQ(tokenizers::grapheme_clusters("\u0600a\u0903"), (Spans{{0, 6}}));                        // GB9b, GB9a
  EXPECT_EQ(tokenizers::grapheme_clusters("\uff76\uff9e"), (Spans{{0, 6}}));      // Extend since Unicode 16.0
  EXPECT_EQ(tokenizers::grapheme_clusters("a\u05c8"), (Spans{{0, 1}, {1, 3}}));    // unassigned in 16.0
}

TEST(T5TokenizerJson, UnsupportedAndMalformedSettingsNameTheJsonPath) {
  auto expect_json_error = [](const std::function<void(json&)>& edit, const std::vector<std::string>& parts) {
    json j = base_json();
    edit(j);
    std::vector<std::string> all = parts;
    all.push_back("t5/tokenizer.json");
    test::expect_error([&] { HfTokenizer::from_json(j, "t5/tokenizer.json"); }, all);
  };
  expect_json_error([](json& j) { j["normalizer"]["normalizers"][1] = {{"type", "NFKC"}}; },
                    {"normalizer.normalizers[1].type 'NFKC' is not supported"});
  expect_json_error([](json& j) { j["normalizer"]["normalizers"][0]["precompiled_charsmap"] = "not*base64"; },
                    {"normalizer.normalizers[0].precompiled_charsmap is not base64"});
  expect_json_error([](json& j) { j["normalizer"]["normalizers"][0]["precompiled_charsmap"] = "AQIDBAUG"; },
                    {"normalizer.normalizers[0].precompiled_charsmap", "trie units"});
  expect_json_error([](json& j) { j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", "(unclosed"}}; },
                    {"normalizer.normalizers[1].pattern.Regex cannot be compiled"});
  expect_json_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["prepend_scheme"] = "sometimes"; },
                    {"pre_tokenizer.pretokenizers[1].prepend_scheme is 'sometimes'"});
  expect_json_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = false; },
                    {"pre_tokenizer.pretokenizers[1].add_prefix_space is false but prepend_scheme is 'always'"});
  expect_json_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["replacement"] = "__"; },
                    {"pre_tokenizer.pretokenizers[1].replacement '__' is not one character"});
  expect_json_error([](json& j) { j["model"]["unk_id"] = 5000; }, {"model.unk_id 5000 is outside model.vocab"});
  expect_json_error([](json& j) { j["model"]["vocab"][7] = json::array({"x"}); },
                    {"model.vocab[7] is [\"x\"], expected [\"piece\", score]"});

  // Without an unk id, a character no piece covers cannot be encoded.
  json j = base_json();
  j["model"]["unk_id"] = nullptr;
  const HfTokenizer no_unk = HfTokenizer::from_json(j, "t5/tokenizer.json");
  EXPECT_EQ(no_unk.encode("hello"), HfTokenizer::from_pretrained(dir()).encode("hello"));
  test::expect_error([&] { no_unk.encode("漢"); }, {"t5/tokenizer.json", "'漢' is not in the Unigram vocabulary"});

  // Through T5Tokenizer, errors name the folder's file.
  TempDir tmp("bad");
  j = base_json();
  j["normalizer"]["normalizers"][1] = {{"type", "Lowercase"}};
  write_json(tmp.path / "tokenizer.json", j);
  test::expect_error([&] { T5Tokenizer::from_pretrained(tmp.path); },
                     {(tmp.path / "tokenizer.json").string(), "normalizer.normalizers[1].type 'Lowercase' is not supported"});
}

}  // namespace
}  // namespace kiln
