#include "io/key_map.h"

#include <algorithm>
#include <cctype>
#include <numeric>
#include <optional>
#include <set>
#include <string_view>

#include "core/error.h"

namespace kiln::io {

namespace {

constexpr const char* kWhere = "key map";

// Values of {i} and {j}; -1 where the pattern has no such placeholder.
using Indices = std::array<int64_t, 2>;
constexpr Indices kNoIndices{-1, -1};

// A compiled key pattern: literals around the placeholders.
class Pattern {
 public:
  Pattern() = default;
  Pattern(const std::string& text, const std::string& map_name) : text_(text) {
    std::string literal;
    for (size_t p = 0; p < text.size(); ++p) {
      if (text[p] != '{') {
        literal += text[p];
        continue;
      }
      KILN_CHECK(p + 2 < text.size() && (text[p + 1] == 'i' || text[p + 1] == 'j') && text[p + 2] == '}', kWhere,
                 map_name, ": pattern '", text, "' has a placeholder other than {i} and {j}");
      literals_.push_back(literal);
      literal.clear();
      slots_.push_back(text[p + 1] == 'i' ? 0 : 1);
      p += 2;
    }
    literals_.push_back(literal);
  }
  const std::string& text() const { return text_; }
  bool has(int slot) const { return std::find(slots_.begin(), slots_.end(), slot) != slots_.end(); }
  bool has_placeholders() const { return !slots_.empty(); }

  // Whether `key` is this pattern (or, with as_prefix, starts with it); fills the indices.
  bool match(std::string_view key, Indices& idx, bool as_prefix = false) const {
    idx = kNoIndices;
    size_t pos = 0;
    for (size_t k = 0; k < literals_.size(); ++k) {
      const std::string& lit = literals_[k];
      if (key.compare(pos, lit.size(), lit) != 0) return false;
      pos += lit.size();
      if (k == slots_.size()) break;
      const size_t start = pos;
      while (pos < key.size() && std::isdigit(static_cast<unsigned char>(key[pos]))) ++pos;
      if (pos == start || pos - start > 9) return false;
      const int64_t v = std::stoll(std::string(key.substr(start, pos - start)));
      int64_t& slot = idx[size_t(slots_[k])];
      if (slot >= 0 && slot != v) return false;  // the same placeholder twice
      slot = v;
    }
    return as_prefix || pos == key.size();
  }

  std::string format(const Indices& idx) const {
    std::string out = literals_[0];
    for (size_t k = 0; k < slots_.size(); ++k) out += std::to_string(idx[size_t(slots_[k])]) + literals_[k + 1];
    return out;
  }

  // The pattern up to the placeholder `slot` (the last one when slot < 0) and the '.' after it:
  // "double_blocks.{i}.img_attn.qkv.weight" -> "double_blocks.{i}.", which names the block.
  Pattern block_prefix(int slot, const std::string& map_name) const {
    size_t end = std::string::npos;
    for (size_t p = 0; p + 2 < text_.size(); ++p)
      if (text_[p] == '{' && (slot < 0 || text_[p + 1] == (slot == 0 ? 'i' : 'j'))) end = p + 3;
    const size_t dot = end == std::string::npos ? end : text_.find('.', end);
    return Pattern(dot == std::string::npos ? text_ : text_.substr(0, dot + 1), map_name);
  }

 private:
  std::string text_;
  std::vector<std::string> literals_;
  std::vector<int> slots_;
};

// The keys of one side (original or Diffusers) and the block indices present in them.
class KeySide {
 public:
  explicit KeySide(const std::vector<std::string>& keys) : keys_(keys), set_(keys.begin(), keys.end()) {}
  const std::vector<std::string>& keys() const { return keys_; }
  bool contains(const std::string& key) const { return set_.count(key) != 0; }

  // The index tuples of the keys that start with `prefix` (a block_prefix).
  const std::set<Indices>& blocks(const Pattern& prefix) const {
    auto it = cache_.find(prefix.text());
    if (it != cache_.end()) return it->second;
    std::set<Indices> found;
    Indices idx;
    for (const std::string& k : keys_)
      if (prefix.match(k, idx, /*as_prefix=*/true)) found.insert(idx);
    return cache_.emplace(prefix.text(), std::move(found)).first->second;
  }
  // 1 + the highest {i} among the keys under `prefix` (0 when none).
  int64_t count_i(const Pattern& prefix) const {
    int64_t n = 0;
    for (const Indices& idx : blocks(prefix)) n = std::max(n, idx[0] + 1);
    return n;
  }

 private:
  const std::vector<std::string>& keys_;
  std::set<std::string> set_;
  mutable std::map<std::string, std::set<Indices>> cache_;
};

// A rule with its patterns compiled, checked for consistency (a bad rule is a bug in the data).
struct CompiledRule {
  const KeyRule* rule = nullptr;
  Pattern original;
  std::vector<Pattern> diffusers;
  Pattern unit_from;
  Pattern original_i_block, diffusers_i_block;  // through {i}: conditions and reversal
  Pattern original_block;                       // through the last placeholder: completeness

  CompiledRule(const KeyRule& r, const std::string& map_name) : rule(&r), original(r.original, map_name) {
    for (const std::string& d : r.diffusers) diffusers.emplace_back(d, map_name);
    const auto bad = [&](const std::string& what) { fail(kWhere, map_name, ": rule '", r.original, "' ", what); };
    if (diffusers.empty()) bad("names no Diffusers key");
    if (r.transform == KeyTransform::rows) {
      if (r.row_units.size() != diffusers.size()) bad("needs one row unit per Diffusers key");
      if (std::count(r.row_units.begin(), r.row_units.end(), kRestOfRows) > 1) bad("has two 'rest' row parts");
      if (std::any_of(r.row_units.begin(), r.row_units.end(), [](int64_t u) { return u <= 0 && u != kRestOfRows; }))
        bad("has a row part of no units");
      if (r.unit_from.empty() && std::count(r.row_units.begin(), r.row_units.end(), kRestOfRows) != 0)
        bad("has a 'rest' row part but no unit_from to size the others by");
      if (!r.unit_from.empty()) unit_from = Pattern(r.unit_from, map_name);
    } else if (diffusers.size() != 1) {
      bad("gives several Diffusers keys without splitting rows");
    }
    if ((r.reversed_index || r.when != BlockCondition::any) && !original.has(0)) bad("reverses or selects by {i} without one");
    if (r.reversed_index && r.when != BlockCondition::any) bad("both reverses and selects by {i}");
    for (const Pattern& d : diffusers)
      if (d.has(0) != original.has(0) || d.has(1) != original.has(1))
        bad("has other placeholders on its Diffusers side ('" + d.text() + "')");
    if (original.has(0)) {
      original_i_block = original.block_prefix(0, map_name);
      diffusers_i_block = diffusers[0].block_prefix(0, map_name);
    }
    if (original.has_placeholders()) original_block = original.block_prefix(-1, map_name);
  }

  // Whether the rule applies to block i of a side whose i-blocks number `n`.
  bool applies(const Indices& idx, int64_t n) const {
    switch (rule->when) {
      case BlockCondition::any: return true;
      case BlockCondition::last: return idx[0] == n - 1;
      case BlockCondition::not_last: return idx[0] != n - 1;
    }
    return true;
  }
};

std::vector<CompiledRule> compile(const KeyMap& map) {
  std::vector<CompiledRule> out;
  out.reserve(map.rules.size());
  for (const KeyRule& r : map.rules) out.emplace_back(r, map.name);
  return out;
}

Indices reverse_i(Indices idx, int64_t n) {
  idx[0] = n - 1 - idx[0];
  return idx;
}

std::string join(const std::vector<std::string>& keys) {
  std::string s;
  for (const std::string& k : keys) s += (s.empty() ? "'" : ", '") + k + "'";
  return s;
}

std::vector<std::string> formatted(const std::vector<Pattern>& patterns, const Indices& idx) {
  std::vector<std::string> out;
  for (const Pattern& p : patterns) out.push_back(p.format(idx));
  return out;
}

// The units of a row split's fixed parts (the rest not counted).
int64_t unit_count(const KeyRule& rule) {
  int64_t n = 0;
  for (const int64_t u : rule.row_units) n += u == kRestOfRows ? 0 : u;
  return n;
}

Shape with_rows(Shape s, int64_t rows) {
  s[0] = rows;
  return s;
}

}  // namespace

std::map<std::string, MappedTensor> resolve_key_map(const KeyMap& map, const std::vector<std::string>& originals,
                                                    const ShapeOf& shape_of, const std::string& file) {
  const std::vector<CompiledRule> rules = compile(map);
  const KeySide side(originals);
  std::map<std::string, MappedTensor> out;

  for (const std::string& key : originals) {
    const CompiledRule* hit = nullptr;
    Indices idx{}, hit_idx{};
    for (const CompiledRule& r : rules) {
      if (!r.original.match(key, idx)) continue;
      if (r.original.has(0) && !r.applies(idx, side.count_i(r.original_i_block))) continue;
      KILN_CHECK(hit == nullptr, kWhere, file, ": tensor '", key, "' matches two rules of the ", map.name, " key map ('",
                 hit ? hit->rule->original : "", "' and '", r.rule->original, "')");
      hit = &r;
      hit_idx = idx;
    }
    KILN_CHECK(hit != nullptr, kWhere, file, ": tensor '", key, "' has no Diffusers name in the ", map.name,
               " key map (no rule matches it)");
    const KeyRule& rule = *hit->rule;
    const Indices didx = rule.reversed_index ? reverse_i(hit_idx, side.count_i(hit->original_i_block)) : hit_idx;
    const std::vector<std::string> dkeys = formatted(hit->diffusers, didx);
    const Shape shape = shape_of(key);
    const auto put = [&](const std::string& dkey, MappedTensor m) {
      m.original = key;
      m.transform = rule.transform;
      m.original_shape = shape;
      KILN_CHECK(out.emplace(dkey, std::move(m)).second, kWhere, file, ": two tensors give the Diffusers tensor '", dkey,
                 "' in the ", map.name, " key map (the second is '", key, "')");
    };
    const auto shape_fail = [&](const std::string& what) {
      fail(kWhere, file, ": tensor '", key, "' has shape ", to_string(shape), ", ", what, " (", map.name, " key map)");
    };
    switch (rule.transform) {
      case KeyTransform::whole: put(dkeys[0], {.shape = shape}); break;
      case KeyTransform::conv1x1_to_linear:
        if (!(shape.size() == 2 || (shape.size() == 4 && shape[2] == 1 && shape[3] == 1)))
          shape_fail("expected a 1x1 convolution [O, I, 1, 1] (or a linear [O, I])");
        put(dkeys[0], {.shape = {shape[0], shape[1]}});
        break;
      case KeyTransform::swap_halves:
        if (shape.empty() || shape[0] % 2 != 0) shape_fail("expected an even number of rows to swap halves of");
        put(dkeys[0], {.shape = shape});
        break;
      case KeyTransform::rows: {
        if (shape.empty()) shape_fail("expected rows to split");
        const int64_t total = shape[0];
        const int64_t units = unit_count(rule);
        const bool has_rest = std::count(rule.row_units.begin(), rule.row_units.end(), kRestOfRows) != 0;
        int64_t unit = 0;
        if (!rule.unit_from.empty()) {
          const std::string from = hit->unit_from.format(hit_idx);
          KILN_CHECK(side.contains(from), kWhere, file, ": tensor '", key, "' is split in units of a dimension of '", from,
                     "', which the file lacks (", map.name, " key map)");
          const Shape fs = shape_of(from);
          KILN_CHECK(rule.unit_dim < int(fs.size()), kWhere, file, ": tensor '", from, "' ", to_string(fs), " has no dim ",
                     rule.unit_dim, " to split '", key, "' by");
          unit = fs[size_t(rule.unit_dim)];
        } else {
          if (has_rest || units == 0 || total % units != 0)
            shape_fail("expected " + std::to_string(units) + " equal parts of rows");
          unit = total / units;
        }
        const int64_t rest = total - unit * units;
        if (rest < 0 || (has_rest && rest == 0) || (!has_rest && rest != 0))
          shape_fail("expected " + std::to_string(units) + " parts of " + std::to_string(unit) + " rows" +
                     (has_rest ? " and a remainder" : ""));
        int64_t begin = 0;
        for (size_t p = 0; p < dkeys.size(); ++p) {
          const int64_t rows = rule.row_units[p] == kRestOfRows ? rest : rule.row_units[p] * unit;
          put(dkeys[p], {.row_begin = begin, .shape = with_rows(shape, rows)});
          begin += rows;
        }
        break;
      }
    }
  }

  // Every required tensor of every block the file has (a fused tensor left out of a block would
  // otherwise surface later as a missing Diffusers key, without the original name).
  for (const CompiledRule& r : rules) {
    if (r.rule->optional) continue;
    if (!r.original.has_placeholders()) {
      KILN_CHECK(side.contains(r.rule->original), kWhere, file, ": tensor '", r.rule->original,
                 "' is missing (the ", map.name, " layout holds ", join(r.rule->diffusers), " in it)");
      continue;
    }
    for (const Indices& idx : side.blocks(r.original_block)) {
      if (r.original.has(0) && !r.applies(idx, side.count_i(r.original_i_block))) continue;
      const std::string want = r.original.format(idx);
      if (side.contains(want)) continue;
      const Indices didx = r.rule->reversed_index ? reverse_i(idx, side.count_i(r.original_i_block)) : idx;
      fail(kWhere, file, ": tensor '", want, "' is missing although the file has other tensors of '",
           r.original_block.format(idx), "' (the ", map.name, " layout holds ", join(formatted(r.diffusers, didx)),
           " in it)");
    }
  }
  return out;
}

std::vector<OriginalTensor> invert_key_map(const KeyMap& map, const std::vector<std::string>& keys,
                                           const ShapeOf& shape_of, const std::string& source) {
  const std::vector<CompiledRule> rules = compile(map);
  const KeySide side(keys);
  std::set<std::string> consumed;
  std::map<std::string, OriginalTensor> out;

  for (const CompiledRule& r : rules) {
    const KeyRule& rule = *r.rule;
    const int64_t n = r.original.has(0) ? side.count_i(r.diffusers_i_block) : 0;
    Indices didx;
    for (const std::string& first : keys) {
      if (!r.diffusers[0].match(first, didx)) continue;
      if (r.original.has(0) && !r.applies(didx, n)) continue;
      const std::vector<std::string> parts = formatted(r.diffusers, didx);
      std::vector<std::string> missing;
      for (const std::string& p : parts)
        if (!side.contains(p)) missing.push_back(p);
      const std::string okey = r.original.format(rule.reversed_index ? reverse_i(didx, n) : didx);
      KILN_CHECK(missing.empty(), kWhere, source, ": the ", map.name, " tensor '", okey, "' is made of ", join(parts),
                 ", but ", join(missing), (missing.size() == 1 ? " is" : " are"), " missing");
      for (const std::string& p : parts)
        KILN_CHECK(consumed.insert(p).second, kWhere, source, ": tensor '", p, "' is written twice in the ", map.name,
                   " layout (a second time into '", okey, "')");
      OriginalTensor t{.key = okey, .transform = rule.transform, .parts = parts, .shape = shape_of(parts[0])};
      const auto bad = [&](const std::string& what) {
        fail(kWhere, source, ": tensor '", parts[0], "' ", to_string(t.shape), " ", what, " (", map.name, " '", okey,
             "')");
      };
      switch (rule.transform) {
        case KeyTransform::whole: break;
        case KeyTransform::conv1x1_to_linear:
          if (t.shape.size() != 2) bad("is not a linear weight [O, I]");
          t.shape = {t.shape[0], t.shape[1], 1, 1};
          break;
        case KeyTransform::swap_halves:
          if (t.shape.empty() || t.shape[0] % 2 != 0) bad("has no two row halves to swap");
          break;
        case KeyTransform::rows: {
          if (t.shape.empty()) bad("has no rows");
          std::vector<int64_t> rows;
          for (const std::string& p : parts) {
            const Shape s = shape_of(p);
            if (s.size() != t.shape.size() || !std::equal(s.begin() + 1, s.end(), t.shape.begin() + 1))
              bad("and '" + p + "' " + to_string(s) + " differ beyond their rows, so they cannot be stacked");
            rows.push_back(s[0]);
          }
          t.shape[0] = std::accumulate(rows.begin(), rows.end(), int64_t(0));
          // Equal parts must come back as equal parts, or reading the file would split it elsewhere.
          const int64_t units = unit_count(rule);
          if (rule.unit_from.empty())
            for (size_t p = 0; p < parts.size(); ++p)
              if (rows[p] * units != t.shape[0] * rule.row_units[p])
                bad("does not split into the layout's " + std::to_string(units) + " equal parts");
          break;
        }
      }
      KILN_CHECK(out.emplace(okey, std::move(t)).second, kWhere, source, ": two rules of the ", map.name,
                 " key map write '", okey, "'");
    }
  }
  for (const std::string& k : keys)
    KILN_CHECK(consumed.count(k), kWhere, source, ": tensor '", k, "' has no place in the ", map.name,
               " layout (no rule of its key map writes it)");
  std::vector<OriginalTensor> sorted;
  for (auto& [k, t] : out) sorted.push_back(std::move(t));
  return sorted;
}

// ---- layout detection ----

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::diffusers: return "Diffusers";
    case Layout::flux1_bfl: return "FLUX.1 (BFL layout)";
    case Layout::flux2_bfl: return "FLUX.2 (BFL layout)";
    case Layout::sd3_stability: return "SD3 (Stability layout)";
    case Layout::ldm_vae: return "LDM VAE";
  }
  return "?";
}

const char* layout_component(Layout layout) {
  switch (layout) {
    case Layout::diffusers: return "";
    case Layout::flux1_bfl:
    case Layout::flux2_bfl:
    case Layout::sd3_stability: return "transformer";
    case Layout::ldm_vae: return "vae";
  }
  return "";
}

std::vector<DetectedLayout> detect_layouts(const std::vector<std::string>& names,
                                           const std::vector<LayoutSignature>& signatures) {
  const std::set<std::string> set(names.begin(), names.end());
  const auto find = [&](const LayoutSignature& s) -> std::optional<DetectedLayout> {
    for (const std::string& prefix : s.prefixes)
      for (const std::string& key : s.keys)
        if (set.count(prefix + key)) return DetectedLayout{s.layout, prefix};
    return std::nullopt;
  };
  std::vector<DetectedLayout> found;
  for (const LayoutSignature& s : signatures)
    if (const std::optional<DetectedLayout> d = find(s)) found.push_back(*d);
  return found;
}

DetectedLayout detect_layout(const std::vector<std::string>& names, const std::vector<LayoutSignature>& signatures,
                             const std::string& component, const std::string& file) {
  const std::vector<DetectedLayout> found = detect_layouts(names, signatures);
  for (const DetectedLayout& d : found)
    if (component.empty() || component == layout_component(d.layout)) return d;
  // A file of original-layout tensors of another component is a wrong file, not a Diffusers one.
  if (!found.empty() && (component == "transformer" || component == "vae"))
    fail(kWhere, file, ": holds a ", layout_component(found[0].layout), " in the ", layout_name(found[0].layout),
         " key names, not a ", component);
  return {};
}

void add_linear(std::vector<KeyRule>& rules, const std::string& original, const std::string& diffusers, bool optional,
                KeyTransform transform, BlockCondition when) {
  for (const char* p : {".weight", ".bias"})
    rules.push_back(
        {.original = original + p, .diffusers = {diffusers + p}, .transform = transform, .optional = optional, .when = when});
}

void add_fused_linear(std::vector<KeyRule>& rules, const std::string& original, const std::vector<std::string>& diffusers,
                      std::vector<int64_t> units, bool optional, const std::string& unit_from, int unit_dim) {
  for (const char* p : {".weight", ".bias"}) {
    std::vector<std::string> keys;
    for (const std::string& d : diffusers) keys.push_back(d + p);
    rules.push_back({.original = original + p,
                     .diffusers = keys,
                     .transform = KeyTransform::rows,
                     .row_units = units,
                     .unit_from = unit_from,
                     .unit_dim = unit_dim,
                     .optional = optional});
  }
}

}  // namespace kiln::io
