// HfTokenizer (tokenizer.json byte-level BPE) against the `tokenizers` library: the fixtures in
// tests/fixtures/hf_tokenizer/ come from tests/fixtures/generate/hf_tokenizer.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "golden.h"
#include "tokenizers/hf_tokenizer.h"
#include "tokenizers/tokenizer_files.h"

namespace kiln {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using tokenizers::HfTokenizer;

fs::path dir() { return test::fixture("hf_tokenizer"); }

const json& probes() {
  static const json j = tokenizers::read_json(dir() / "probes.json", "probes");
  return j;
}

json base_json(const std::string& name) { return tokenizers::read_json(dir() / name / "tokenizer.json", "tokenizer.json"); }

// The generator's apply(): top-level keys replaced, "model" keys merged into the base model.
json with_overrides(json base, const json& overrides) {
  for (const auto& [key, value] : overrides.items()) {
    if (key == "model") {
      for (const auto& [k, v] : value.items()) base["model"][k] = v;
    } else {
      base[key] = value;
    }
  }
  return base;
}

HfTokenizer load(const std::string& name) {
  if (fs::exists(dir() / name / "tokenizer.json")) return HfTokenizer::from_pretrained(dir() / name);
  const json variants = tokenizers::read_json(dir() / "variants.json", "variants");
  for (const auto& v : variants)
    if (v["name"] == name)
      return HfTokenizer::from_json(with_overrides(base_json(v["base"].get<std::string>()), v["overrides"]), name);
  throw std::runtime_error("no tokenizer fixture " + name);
}

std::string printable(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else out += c;
  }
  return out;
}

// Every probe's ids, with and without special tokens, exactly as the reference.
void check_probes(const std::string& name) {
  const HfTokenizer tok = load(name);
  const json& p = probes();
  const auto& texts = p["probes"];
  ASSERT_TRUE(p["ids"].contains(name)) << name;
  size_t exact = 0, total = 0;
  for (const char* key : {"ids", "ids_no_special"}) {
    const auto& want_all = p[key][name];
    ASSERT_EQ(want_all.size(), texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::string text = texts[i].get<std::string>();
      const auto want = want_all[i].get<std::vector<int64_t>>();
      const auto got = tok.encode(text, std::string(key) == "ids");
      ++total;
      if (got == want) {
        ++exact;
        continue;
      }
      std::string tokens;
      for (const auto& t : tok.tokenize(text)) tokens += "'" + t + "' ";
      ADD_FAILURE() << name << " " << key << " probe " << i << " \"" << printable(text) << "\": got "
                    << ::testing::PrintToString(got) << ", want " << ::testing::PrintToString(want)
                    << "; kiln tokens " << tokens;
    }
  }
  std::printf("[ HfTokenizer ] %s: %zu/%zu probe encodings exact\n", name.c_str(), exact, total);
}

TEST(HfTokenizer, Qwen2StyleMatchesTokenizers) { check_probes("qwen2"); }
TEST(HfTokenizer, Gpt2StyleWithBosTemplateMatchesTokenizers) { check_probes("gpt2_bos"); }
TEST(HfTokenizer, TekkenStyleIgnoreMergesMatchesTokenizers) { check_probes("tekken"); }
TEST(HfTokenizer, PrefixSpaceAndAddedTokenFlagsMatchTokenizers) { check_probes("prefix_space"); }
TEST(HfTokenizer, SplitBehaviorsMatchTokenizers) { check_probes("split_behaviors"); }
TEST(HfTokenizer, RawCharactersWithFusedUnkMatchTokenizers) { check_probes("raw_chars_unk"); }

TEST(HfTokenizer, AddedTokensAndVocabulary) {
  const HfTokenizer q = load("qwen2");
  const json j = base_json("qwen2");
  for (const auto& t : j["added_tokens"]) {
    ASSERT_TRUE(q.id_of(t["content"].get<std::string>()).has_value());
    EXPECT_EQ(*q.id_of(t["content"].get<std::string>()), t["id"].get<int64_t>());
  }
  EXPECT_EQ(q.id_of("Ġworlds"), std::optional<int64_t>(j["model"]["vocab"]["Ġworlds"].get<int64_t>()));
  EXPECT_FALSE(q.id_of("no such token").has_value());
  EXPECT_EQ(q.vocab_size(), int64_t(j["model"]["vocab"].size() + j["added_tokens"].size()));
  EXPECT_EQ(q.num_special_tokens_to_add(), 0);
  const auto tokens = q.tokenize("<|im_start|>user hi<|im_end|>");
  ASSERT_GE(tokens.size(), 3u);
  EXPECT_EQ(tokens.front(), "<|im_start|>");
  EXPECT_EQ(tokens.back(), "<|im_end|>");
  std::string middle;
  for (size_t i = 1; i + 1 < tokens.size(); ++i) middle += tokens[i];
  EXPECT_EQ(middle, "userĠhi");
  EXPECT_EQ(load("gpt2_bos").num_special_tokens_to_add(), 1);
}

TEST(HfTokenizer, EncodePaddedTruncatesAndPads) {
  const HfTokenizer g = load("gpt2_bos");
  const int64_t bos = *g.id_of("<s>"), pad = *g.id_of("</s>");
  const std::string text = "A painting of a squirrel eating a burger";
  const auto full = g.encode(text);
  ASSERT_GT(full.size(), 6u);
  ASSERT_EQ(full[0], bos);

  const auto cut = g.encode_padded(text, 5, pad);  // BOS + 4 text ids, no padding
  EXPECT_EQ(cut.ids, std::vector<int64_t>(full.begin(), full.begin() + 5));
  EXPECT_EQ(cut.attention_mask, std::vector<int64_t>(5, 1));

  const auto padded = g.encode_padded(text, int64_t(full.size()) + 3, pad);
  std::vector<int64_t> want = full;
  want.insert(want.end(), 3, pad);
  EXPECT_EQ(padded.ids, want);
  std::vector<int64_t> mask(full.size(), 1);
  mask.insert(mask.end(), 3, 0);
  EXPECT_EQ(padded.attention_mask, mask);

  const auto no_special = g.encode_padded(text, 4, pad, /*add_special_tokens=*/false);
  EXPECT_EQ(no_special.ids, std::vector<int64_t>(full.begin() + 1, full.begin() + 5));
  EXPECT_THROW(g.encode_padded(text, 0, pad), Error);
}

// ---- errors ----

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << parts.front() << "'";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\n lacks: " << p;
  }
}

void expect_json_error(const std::function<void(json&)>& edit, const std::vector<std::string>& parts,
                       const std::string& base = "qwen2") {
  json j = base_json(base);
  edit(j);
  std::vector<std::string> all = parts;
  all.push_back("my/tokenizer.json");
  expect_error([&] { HfTokenizer::from_json(j, "my/tokenizer.json"); }, all);
}

TEST(HfTokenizer, UnsupportedTypesNameTheJsonPath) {
  expect_json_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][1] = {{"type", "Punctuation"}}; },
                    {"pre_tokenizer.pretokenizers[1].type 'Punctuation' is not supported"});
  expect_json_error([](json& j) { j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}}; },
                    {"normalizer.normalizers[1].type 'Lowercase' is not supported"});
  expect_json_error([](json& j) { j["model"]["type"] = "WordPiece"; }, {"model.type 'WordPiece' is not supported"});
  expect_json_error([](json& j) { j["model"]["byte_fallback"] = true; }, {"model.byte_fallback 'true' is not supported"});
  expect_json_error([](json& j) { j["post_processor"] = {{"type", "BertProcessing"}}; },
                    {"post_processor.type 'BertProcessing' is not supported"});
  expect_json_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways"; },
                    {"pre_tokenizer.pretokenizers[0].behavior 'Sideways' is not supported"});
  expect_json_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(unclosed"}}; },
                    {"pre_tokenizer.pretokenizers[0].pattern.Regex cannot be compiled"});
}

TEST(HfTokenizer, MalformedModelIsAnError) {
  expect_json_error([](json& j) { j["model"]["merges"][0] = "a b c"; }, {"model.merges[0]", "not a merge"});
  expect_json_error([](json& j) { j["model"]["merges"][2] = 42; }, {"model.merges[2] is 42"});
  expect_json_error([](json& j) { j["model"]["merges"][3] = "Ġ zzzz"; }, {"model.merges[3]: 'zzzz' is not in model.vocab"});
  expect_json_error([](json& j) { j["model"]["merges"][1] = json::array({"x", "q"}); }, {"model.merges[1]: 'xq' is not in model.vocab"},
                    "gpt2_bos");
  expect_json_error([](json& j) { j["model"]["vocab"]["Ġworlds"] = -3; }, {"model.vocab['Ġworlds'] = -3 is out of range"});
  expect_json_error([](json& j) { j["model"]["vocab"]["Ġworlds"] = "7"; }, {"model.vocab['Ġworlds'] is a string"});
  expect_json_error([](json& j) { j["model"].erase("merges"); }, {"model.merges is missing"});
  expect_json_error([](json& j) { j.erase("model"); }, {"model is missing"});
  expect_json_error([](json& j) { j["model"]["unk_token"] = "<nope>"; }, {"model.unk_token '<nope>' is not in model.vocab"});
}

TEST(HfTokenizer, MalformedAddedTokensAndTemplatesAreErrors) {
  expect_json_error([](json& j) { j["added_tokens"][1]["id"] = 5; }, {"added_tokens[1].id is 5 but"});
  expect_json_error([](json& j) { j["added_tokens"][0].erase("content"); }, {"added_tokens[0].content is missing"});
  expect_json_error([](json& j) { j["added_tokens"][0]["id"] = -1; }, {"added_tokens[0].id = -1 is out of range"});
  expect_json_error([](json& j) { j["post_processor"]["special_tokens"].erase("<s>"); },
                    {"post_processor.special_tokens['<s>'] is missing"}, "gpt2_bos");
  expect_json_error([](json& j) { j["post_processor"]["single"][1] = {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}; },
                    {"post_processor.single[1].Sequence.id is 'B'"}, "gpt2_bos");
}

TEST(HfTokenizer, FileErrorsNameTheFile) {
  const fs::path tmp = fs::temp_directory_path() / ("kiln_hf_tokenizer_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  std::ofstream(tmp / "tokenizer.json") << "{\"model\": {\"vocab\": {}, ";
  expect_error([&] { HfTokenizer::from_pretrained(tmp); }, {(tmp / "tokenizer.json").string(), "bad JSON"});
  std::ofstream(tmp / "tokenizer.json") << "[1, 2]";
  expect_error([&] { HfTokenizer::from_file(tmp / "tokenizer.json"); }, {(tmp / "tokenizer.json").string(), "expected an object"});
  fs::remove(tmp / "tokenizer.json");
  expect_error([&] { HfTokenizer::from_pretrained(tmp); }, {(tmp / "tokenizer.json").string(), "not found"});
  fs::remove_all(tmp);
  expect_error([&] { HfTokenizer::from_pretrained(tmp); }, {tmp.string(), "does not exist"});
}

TEST(HfTokenizer, InvalidUtf8IsAnError) {
  const HfTokenizer q = load("qwen2");
  EXPECT_THROW(q.encode(std::string("ab\xff" "cd")), Error);
}

}  // namespace
}  // namespace kiln
