// Reading tokenizer.json (HfTokenizer::from_json/from_file): the model (BPE or Unigram), the
// normalizers, pre-tokenizers, added tokens and post-processor, each checked, with errors that
// name the file and the JSON path; anything tokenizers does that kiln does not is refused by name.
#include <functional>
#include <optional>

#include "core/error.h"
#include "io/json_config.h"
#include "tokenizers/hf_tokenizer_state.h"
#include "tokenizers/precompiled_charsmap.h"

namespace kiln::tokenizers {
using nlohmann::json;
using namespace hf;

std::string hf::oniguruma_spaces(const std::string& p) {
  const std::string mvs = "\\x{180E}";
  const std::string not_space = "(?!" + mvs + ")";
  std::string out;
  size_t i = 0;
  while (i < p.size()) {
    if (p[i] == '\\' && i + 1 < p.size()) {
      if (p[i + 1] == 's') out += "(?:" + not_space + "\\s)";
      else if (p[i + 1] == 'S') out += "(?:" + mvs + "|\\S)";
      else out += p.substr(i, 2);
      i += 2;
      continue;
    }
    if (p[i] != '[') {
      out += p[i++];
      continue;
    }
    // A character class: find its end, noting \s / \S inside.
    size_t j = i + 1;
    const bool negated = j < p.size() && p[j] == '^';
    if (negated) ++j;
    if (j < p.size() && p[j] == ']') ++j;  // a leading ']' is literal
    bool has_s = false, has_S = false;
    while (j < p.size() && p[j] != ']') {
      if (p[j] == '\\' && j + 1 < p.size()) {
        has_s |= p[j + 1] == 's';
        has_S |= p[j + 1] == 'S';
        j += 2;
      } else if (p[j] == '[' && j + 1 < p.size() && p[j + 1] == ':') {
        const size_t end = p.find(":]", j + 2);
        j = end == std::string::npos ? p.size() : end + 2;
      } else {
        ++j;
      }
    }
    const std::string cls = p.substr(i, std::min(j + 1, p.size()) - i);
    i = j + 1;
    if (!has_s && !has_S) {
      out += cls;
      continue;
    }
    // U+180E is in Oniguruma's class when exactly one of "negated" and "has \S" holds (it is not \s there).
    const bool member = negated != has_S;
    out += member ? "(?:" + mvs + "|" + cls + ")" : "(?:" + not_space + cls + ")";
  }
  return out;
}


namespace {

// ---- JSON reading with errors naming the file and the path ----

struct Reader {
  std::string source;

  template <typename... Parts>
  [[noreturn]] void error(const std::string& path, const Parts&... parts) const {
    fail("tokenizer", source, ": ", path, parts...);
  }
  const json& field(const json& obj, const std::string& key, const std::string& path) const {
    if (!obj.is_object()) error(path, " is ", io::json_kind(obj), ", expected an object");
    const auto it = obj.find(key);
    if (it == obj.end()) error(path.empty() ? key : path + "." + key, " is missing");
    return *it;
  }
  std::string string_field(const json& obj, const std::string& key, const std::string& path) const {
    const json& v = field(obj, key, path);
    if (!v.is_string()) error(path + "." + key, " is ", io::json_kind(v), ", expected a string");
    return v.get<std::string>();
  }
  bool bool_field(const json& obj, const std::string& key, const std::string& path, bool fallback) const {
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) error(path + "." + key, " is ", io::json_kind(*it), ", expected true or false");
    return it->get<bool>();
  }
  int64_t id_value(const json& v, const std::string& path) const {
    if (!v.is_number_integer()) error(path, " is ", io::json_kind(v), ", expected an integer id");
    const auto id = v.get<int64_t>();
    if (id < 0 || id > int64_t(UINT32_MAX)) error(path, " = ", id, " is out of range (ids are 0..2^32-1)");
    return id;
  }
  std::string type_of(const json& obj, const std::string& path) const {
    if (!obj.is_object()) error(path, " is ", io::json_kind(obj), ", expected an object with a \"type\"");
    return string_field(obj, "type", path);
  }
  const json& array_field(const json& obj, const std::string& key, const std::string& path) const {
    const json& v = field(obj, key, path);
    if (!v.is_array()) error(path + "." + key, " is ", io::json_kind(v), ", expected an array");
    return v;
  }
  [[noreturn]] void unsupported(const std::string& path, const std::string& what) const {
    error(path, " '", what, "' is not supported");
  }
  // obj.pattern of a Replace normalizer or a Split pre-tokenizer: {"Regex": "..."} compiled into
  // `regex`, or {"String": "..."} into `literal` (regex left null).
  void pattern_field(const json& obj, const std::string& path, std::shared_ptr<const Regex>& regex,
                     std::string& literal) const {
    const json& pattern = field(obj, "pattern", path);
    if (pattern.is_object() && pattern.size() == 1 && pattern.contains("Regex") && pattern["Regex"].is_string()) {
      try {
        regex = std::make_shared<const Regex>(oniguruma_spaces(pattern["Regex"].get<std::string>()));
      } catch (const Error& e) {
        error(path + ".pattern.Regex", " cannot be compiled: ", e.what());
      }
    } else if (pattern.is_object() && pattern.size() == 1 && pattern.contains("String") && pattern["String"].is_string()) {
      literal = pattern["String"].get<std::string>();
    } else {
      error(path + ".pattern", " is ", pattern.dump(), ", expected {\"Regex\": \"...\"} or {\"String\": \"...\"}");
    }
  }
};


void read_bpe(const Reader& r, const json& model, HfTokenizer::State& s) {
  const json& vocab = r.field(model, "vocab", "model");
  if (!vocab.is_object()) r.error("model.vocab", " is ", io::json_kind(vocab), ", expected an object");
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab.items()) {
    const int64_t v = r.id_value(id, "model.vocab['" + token + "']");
    s.vocab.emplace(token, v);
    max_id = std::max(max_id, v);
  }
  s.model_size = int64_t(s.vocab.size());
  s.vocab_r.assign(size_t(max_id + 1), std::string());
  for (const auto& [token, id] : s.vocab) s.vocab_r[size_t(id)] = token;
  s.ignore_merges = r.bool_field(model, "ignore_merges", "model", false);
  s.fuse_unk = r.bool_field(model, "fuse_unk", "model", false);
  if (r.bool_field(model, "byte_fallback", "model", false)) r.unsupported("model.byte_fallback", "true");
  if (const auto it = model.find("dropout"); it != model.end() && !it->is_null() &&
                                              !(it->is_number() && it->get<double>() == 0.0))
    r.unsupported("model.dropout", it->dump());
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const auto it = model.find(key); it != model.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      r.unsupported(std::string("model.") + key, it->dump());
  if (const auto it = model.find("unk_token"); it != model.end() && !it->is_null()) {
    if (!it->is_string()) r.error("model.unk_token", " is ", io::json_kind(*it), ", expected a string or null");
    const auto v = s.vocab.find(it->get<std::string>());
    if (v == s.vocab.end()) r.error("model.unk_token", " '", it->get<std::string>(), "' is not in model.vocab");
    s.unk = v->second;
  }
  const json& merges = r.array_field(model, "merges", "model");
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    const std::string path = "model.merges[" + std::to_string(i) + "]";
    std::string a, b;
    if (m.is_string()) {
      const std::string line = m.get<std::string>();
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
        r.error(path, " '", line, "' is not a merge \"left right\" (one space)");
      a = line.substr(0, sp), b = line.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      r.error(path, " is ", m.dump(), ", expected \"left right\" or [\"left\", \"right\"]");
    }
    auto id_of = [&](const std::string& t) {
      const auto it = s.vocab.find(t);
      if (it == s.vocab.end()) r.error(path, ": '", t, "' is not in model.vocab");
      return it->second;
    };
    const int64_t ia = id_of(a), ib = id_of(b), merged = id_of(a + b);
    s.merges.insert_or_assign(pair_key(ia, ib), std::pair{int64_t(i), merged});  // a repeated pair keeps its last rank
  }
}

// model.vocab is [[piece, score], ...]; ids are the positions.
void read_unigram(const Reader& r, const json& model, HfTokenizer::State& s) {
  const json& vocab = r.array_field(model, "vocab", "model");
  std::vector<UnigramModel::Piece> pieces;
  pieces.reserve(vocab.size());
  for (size_t i = 0; i < vocab.size(); ++i) {
    const json& e = vocab[i];
    if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number())
      r.error("model.vocab[" + std::to_string(i) + "]", " is ", e.dump(), ", expected [\"piece\", score]");
    pieces.push_back({e[0].get<std::string>(), e[1].get<double>()});
  }
  std::optional<int64_t> unk;
  if (const auto it = model.find("unk_id"); it != model.end() && !it->is_null()) unk = r.id_value(*it, "model.unk_id");
  const bool byte_fallback = r.bool_field(model, "byte_fallback", "model", false);
  s.vocab_r.clear();
  for (const auto& p : pieces) s.vocab_r.push_back(p.text);
  auto m = std::make_shared<const UnigramModel>(std::move(pieces), unk, byte_fallback, r.source);
  s.vocab.clear();
  for (size_t i = 0; i < m->pieces().size(); ++i) s.vocab.insert_or_assign(m->pieces()[i].text, int64_t(i));
  s.model_size = int64_t(m->pieces().size());
  s.unk = unk.value_or(-1);
  s.unigram = std::move(m);
}


}  // namespace

std::shared_ptr<HfTokenizer::State> parse_tokenizer_json(const json& j, const std::string& source) {
  auto s = std::make_shared<HfTokenizer::State>();
  s->source = source;
  const Reader r{source};
  if (!j.is_object()) r.error("top level", " is ", io::json_kind(j), ", expected an object");

  // ---- model ----
  const json& model = r.field(j, "model", "");
  if (!model.is_object()) r.error("model", " is ", io::json_kind(model), ", expected an object");
  // Without a "type" tokenizers tries each model in turn; a list vocabulary can only be Unigram's.
  std::string type = "BPE";
  if (model.contains("type")) type = r.type_of(model, "model");
  else if (const auto it = model.find("vocab"); it != model.end() && it->is_array()) type = "Unigram";
  if (type == "BPE") read_bpe(r, model, *s);
  else if (type == "Unigram") read_unigram(r, model, *s);
  else r.unsupported("model.type", type);

  // ---- normalizer ----
  std::function<void(const json&, const std::string&)> read_normalizer = [&](const json& n, const std::string& path) {
    if (n.is_null()) return;
    const std::string type = r.type_of(n, path);
    NormalizerStep step;
    if (type == "NFC") {
      step.kind = NormalizerStep::Kind::kNFC;
    } else if (type == "Sequence") {
      const json& list = r.array_field(n, "normalizers", path);
      for (size_t i = 0; i < list.size(); ++i) read_normalizer(list[i], path + ".normalizers[" + std::to_string(i) + "]");
      return;
    } else if (type == "Precompiled") {
      step.kind = NormalizerStep::Kind::kPrecompiled;
      const std::string what = source + ": " + path + ".precompiled_charsmap";
      step.charsmap = std::make_shared<const PrecompiledCharsmap>(
          PrecompiledCharsmap::base64_decode(r.string_field(n, "precompiled_charsmap", path), what), what);
    } else if (type == "Replace") {
      step.kind = NormalizerStep::Kind::kReplace;
      r.pattern_field(n, path, step.regex, step.literal);
      step.content = r.string_field(n, "content", path);
    } else if (type == "Strip") {
      step.kind = NormalizerStep::Kind::kStrip;
      step.strip_left = r.bool_field(n, "strip_left", path, true);
      step.strip_right = r.bool_field(n, "strip_right", path, true);
    } else {
      r.unsupported(path + ".type", type);
    }
    s->normalizers.push_back(std::move(step));
  };
  if (const auto it = j.find("normalizer"); it != j.end()) read_normalizer(*it, "normalizer");

  // ---- pre-tokenizer ----
  std::function<void(const json&, const std::string&)> read_pre = [&](const json& p, const std::string& path) {
    if (p.is_null()) return;
    const std::string type = r.type_of(p, path);
    if (type == "Sequence") {
      const json& list = r.array_field(p, "pretokenizers", path);
      for (size_t i = 0; i < list.size(); ++i) read_pre(list[i], path + ".pretokenizers[" + std::to_string(i) + "]");
    } else if (type == "ByteLevel") {
      PreStep st;
      st.kind = PreStep::Kind::kByteLevel;
      st.add_prefix_space = r.bool_field(p, "add_prefix_space", path, true);
      st.use_regex = r.bool_field(p, "use_regex", path, true);
      r.bool_field(p, "trim_offsets", path, true);  // offsets only
      s->pre_steps.push_back(std::move(st));
    } else if (type == "WhitespaceSplit") {
      PreStep st;
      st.kind = PreStep::Kind::kWhitespaceSplit;
      s->pre_steps.push_back(std::move(st));
    } else if (type == "Metaspace") {
      PreStep st;
      st.kind = PreStep::Kind::kMetaspace;
      st.replacement = r.string_field(p, "replacement", path);
      if (utf8_decode(st.replacement, path + ".replacement").size() != 1)
        r.error(path + ".replacement", " '", st.replacement, "' is not one character");
      const std::string scheme =
          p.contains("prepend_scheme") ? r.string_field(p, "prepend_scheme", path) : std::string("always");
      if (scheme == "always") st.prepend = Prepend::kAlways;
      else if (scheme == "first") st.prepend = Prepend::kFirst;
      else if (scheme == "never") st.prepend = Prepend::kNever;
      else r.error(path + ".prepend_scheme", " is '", scheme, "', expected 'always', 'first' or 'never'");
      // Files from before prepend_scheme say add_prefix_space; false must come with "never" (tokenizers refuses
      // the file otherwise).
      if (!r.bool_field(p, "add_prefix_space", path, true) && st.prepend != Prepend::kNever)
        r.error(path + ".add_prefix_space", " is false but prepend_scheme is '", scheme, "'");
      st.split = r.bool_field(p, "split", path, true);
      s->pre_steps.push_back(std::move(st));
    } else if (type == "Split") {
      PreStep st;
      r.pattern_field(p, path, st.regex, st.literal);
      const std::string behavior = r.string_field(p, "behavior", path);
      static const std::pair<const char*, Behavior> kBehaviors[] = {
          {"Removed", Behavior::kRemoved},
          {"Isolated", Behavior::kIsolated},
          {"MergedWithPrevious", Behavior::kMergedWithPrevious},
          {"MergedWithNext", Behavior::kMergedWithNext},
          {"Contiguous", Behavior::kContiguous}};
      bool known = false;
      for (const auto& [name, b] : kBehaviors)
        if (behavior == name) st.behavior = b, known = true;
      if (!known) r.unsupported(path + ".behavior", behavior);
      st.invert = r.bool_field(p, "invert", path, false);
      s->pre_steps.push_back(std::move(st));
    } else {
      r.unsupported(path + ".type", type);
    }
  };
  if (const auto it = j.find("pre_tokenizer"); it != j.end()) read_pre(*it, "pre_tokenizer");

  // ---- added tokens (ids as tokenizers assigns them: the vocabulary's id, else the next free one) ----
  if (const auto it = j.find("added_tokens"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) r.error("added_tokens", " is ", io::json_kind(*it), ", expected an array");
    int64_t next_id = -1;  // AddedVocabulary::add_tokens
    const int64_t model_size = s->model_size;
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      const std::string path = "added_tokens[" + std::to_string(i) + "]";
      AddedTok a;
      a.content = r.string_field(t, "content", path);
      const int64_t declared = r.id_value(r.field(t, "id", path), path + ".id");
      a.special = r.bool_field(t, "special", path, false);
      a.normalized = r.bool_field(t, "normalized", path, !a.special);
      a.lstrip = r.bool_field(t, "lstrip", path, false);
      a.rstrip = r.bool_field(t, "rstrip", path, false);
      a.single_word = r.bool_field(t, "single_word", path, false);
      if (a.content.empty()) continue;
      if (next_id < 0) {
        int64_t max_added = -1;
        for (const auto& [c, id] : s->added_ids) max_added = std::max(max_added, id);
        next_id = max_added < 0 ? model_size : (max_added >= model_size || model_size == 0 ? max_added + 1 : model_size);
      }
      int64_t id;
      if (auto f = s->added_ids.find(a.content); f != s->added_ids.end()) id = f->second;
      else if (auto v = s->vocab.find(a.content); v != s->vocab.end()) id = v->second;
      else id = next_id++;
      if (id != declared)
        r.error(path + ".id", " is ", declared, " but the tokenizers library gives '", a.content, "' id ", id,
                " (the vocabulary's id, else the next id after the vocabulary and the earlier added tokens)");
      a.id = id;
      s->added_ids.insert_or_assign(a.content, id);
      s->added_text.insert_or_assign(id, a.content);
      if (a.normalized) {
        a.content = s->normalize(a.content);
        if (a.content.empty()) continue;
        s->normalized_tokens.tokens.push_back(std::move(a));
      } else {
        s->raw_tokens.tokens.push_back(std::move(a));
      }
    }
  }
  s->raw_tokens.build();
  s->normalized_tokens.build();

  // ---- post-processor ----
  std::function<void(const json&, const std::string&)> read_post = [&](const json& p, const std::string& path) {
    if (p.is_null()) return;
    const std::string type = r.type_of(p, path);
    if (type == "ByteLevel") return;  // offsets only
    if (type == "Sequence") {
      const json& list = r.array_field(p, "processors", path);
      for (size_t i = 0; i < list.size(); ++i) read_post(list[i], path + ".processors[" + std::to_string(i) + "]");
      return;
    }
    if (type != "TemplateProcessing") r.unsupported(path + ".type", type);
    const json& specials = r.field(p, "special_tokens", path);
    if (!specials.is_object())
      r.error(path + ".special_tokens", " is ", io::json_kind(specials), ", expected an object");
    const json& single = r.array_field(p, "single", path);
    std::vector<std::optional<std::vector<int64_t>>> tmpl;
    for (size_t i = 0; i < single.size(); ++i) {
      const json& e = single[i];
      const std::string epath = path + ".single[" + std::to_string(i) + "]";
      if (e.is_object() && e.size() == 1 && e.contains("Sequence")) {
        const std::string seq = r.string_field(e["Sequence"], "id", epath + ".Sequence");
        if (seq != "A") r.error(epath + ".Sequence.id", " is '", seq, "', expected 'A' in a single template");
        tmpl.emplace_back(std::nullopt);
      } else if (e.is_object() && e.size() == 1 && e.contains("SpecialToken")) {
        const std::string name = r.string_field(e["SpecialToken"], "id", epath + ".SpecialToken");
        const std::string spath = path + ".special_tokens['" + name + "']";
        if (!specials.contains(name)) r.error(spath, " is missing (used by ", epath, ")");
        const json& ids = r.array_field(specials[name], "ids", spath);
        std::vector<int64_t> v;
        for (size_t k = 0; k < ids.size(); ++k) v.push_back(r.id_value(ids[k], spath + ".ids[" + std::to_string(k) + "]"));
        tmpl.emplace_back(std::move(v));
      } else {
        r.error(epath, " is ", e.dump(), ", expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
      }
    }
    s->templates.push_back(std::move(tmpl));
  };
  if (const auto it = j.find("post_processor"); it != j.end()) read_post(*it, "post_processor");
  return s;
}

}  // namespace kiln::tokenizers
