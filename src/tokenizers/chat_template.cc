#include "tokenizers/chat_template.h"

#include <algorithm>
#include <cctype>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_config.h"
#include "tokenizers/regex.h"
#include "tokenizers/tokenizer_files.h"

namespace kiln::tokenizers {
namespace fs = std::filesystem;

namespace {

const char* const kFamilies =
    "chat_template is not one kiln can render (it renders Mistral [INST]/[SYSTEM_PROMPT] templates and Qwen ChatML "
    "templates); ";

// One piece of a Jinja template: raw text or a tag.
struct Piece {
  enum Type { text, expr, block, comment } type = text;
  std::string body;  // the tag's inside without its delimiters and whitespace-control marks, or the text
  bool strip_before = false, strip_after = false;  // "{%-" / "-%}"
  bool keep_before = false, keep_after = false;    // "{%+" / "+%}" (lstrip/trim disabled)
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Splits a template into text and tags; string literals inside tags may contain the closing delimiter.
// Returns an error text on an unterminated tag.
std::optional<std::string> lex(const std::string& t, std::vector<Piece>& out) {
  size_t i = 0;
  while (i < t.size()) {
    size_t open = std::string::npos;
    for (size_t k = t.find('{', i); k != std::string::npos && k + 1 < t.size(); k = t.find('{', k + 1))
      if (t[k + 1] == '{' || t[k + 1] == '%' || t[k + 1] == '#') {
        open = k;
        break;
      }
    if (open == std::string::npos) {
      out.push_back({Piece::text, t.substr(i)});
      break;
    }
    if (open > i) out.push_back({Piece::text, t.substr(i, open - i)});
    Piece p;
    const char kind = t[open + 1];
    p.type = kind == '{' ? Piece::expr : kind == '%' ? Piece::block : Piece::comment;
    const char close = kind == '{' ? '}' : kind;
    size_t j = open + 2;
    if (j < t.size() && t[j] == '-') p.strip_before = true, ++j;
    else if (j < t.size() && t[j] == '+') p.keep_before = true, ++j;
    const size_t body_begin = j;
    size_t end = std::string::npos;
    while (j + 1 < t.size()) {
      const char c = t[j];
      if (p.type != Piece::comment && (c == '\'' || c == '"')) {
        for (++j; j < t.size() && t[j] != c; ++j)
          if (t[j] == '\\') ++j;
        ++j;
        continue;
      }
      if (c == close && t[j + 1] == '}') {
        end = j;
        break;
      }
      ++j;
    }
    if (end == std::string::npos) return "a tag opened at offset " + std::to_string(open) + " is not closed";
    size_t body_end = end;
    if (body_end > body_begin && t[body_end - 1] == '-') p.strip_after = true, --body_end;
    else if (body_end > body_begin && t[body_end - 1] == '+') p.keep_after = true, --body_end;
    p.body = t.substr(body_begin, body_end - body_begin);
    out.push_back(std::move(p));
    i = end + 2;
  }
  return std::nullopt;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string first_word(const std::string& body) {
  const std::string b = trim(body);
  size_t n = 0;
  while (n < b.size() && (std::isalnum(static_cast<unsigned char>(b[n])) || b[n] == '_')) ++n;
  return b.substr(0, n);
}

// What Jinja (trim_blocks, lstrip_blocks, "-"/"+" marks) emits of raw text piece k; kiln needs it empty.
std::string emitted_text(const std::vector<Piece>& pieces, size_t k) {
  std::string t = pieces[k].body;
  const Piece* prev = k > 0 ? &pieces[k - 1] : nullptr;
  const Piece* next = k + 1 < pieces.size() ? &pieces[k + 1] : nullptr;
  bool line_starting = prev == nullptr;
  if (prev != nullptr && prev->strip_after) {
    size_t n = 0;
    while (n < t.size() && is_space(t[n])) ++n;
    line_starting = n > 0 && t[n - 1] == '\n';
    t.erase(0, n);
  } else if (prev != nullptr && prev->type != Piece::expr && !prev->keep_after && !t.empty() && t[0] == '\n') {
    t.erase(0, 1);  // trim_blocks
    line_starting = true;
  }
  if (next != nullptr && next->strip_before) {
    while (!t.empty() && is_space(t.back())) t.pop_back();
  } else if (next != nullptr && next->type != Piece::expr && !next->keep_before) {
    // lstrip_blocks: spaces and tabs from the start of the line up to a block or comment tag.
    const size_t line = t.rfind('\n') == std::string::npos ? 0 : t.rfind('\n') + 1;
    if ((line > 0 || line_starting) &&
        std::all_of(t.begin() + long(line), t.end(), [](char c) { return c == ' ' || c == '\t'; }))
      t.erase(line);
  }
  return t;
}

// The values of the string literals in a tag body, with Python's common escapes decoded.
std::vector<std::string> string_literals(const std::string& body) {
  std::vector<std::string> out;
  for (size_t i = 0; i < body.size(); ++i) {
    const char q = body[i];
    if (q != '\'' && q != '"') continue;
    std::string v;
    for (++i; i < body.size() && body[i] != q; ++i) {
      if (body[i] == '\\' && i + 1 < body.size()) {
        const char e = body[++i];
        if (e == 'n') v += '\n';
        else if (e == 't') v += '\t';
        else if (e == 'r') v += '\r';
        else if (e == '\\' || e == '\'' || e == '"') v += e;
        else v += std::string{'\\', e};  // kept as written (Python keeps unknown escapes)
      } else {
        v += body[i];
      }
    }
    out.push_back(std::move(v));
  }
  return out;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A Jinja variable access such as text, message['content'], messages[0].content.
const std::string kVar = R"([A-Za-z_]\w*(?:\.\w+|\[\s*(?:'[^']*'|"[^"]*"|\d+)\s*\])*)";
const std::string kNl = R"('(?:\\n|\n)')";  // '\n', escaped or a raw newline inside the quotes

// The branch a tag sits in: one entry per enclosing {% if %}/{% elif %} (its condition), {% else %} (the
// negated condition of its if/elif) or {% for %} / other block, innermost last.
struct Branch {
  std::string cond;
  bool negated = false;
};
struct Located {
  std::string body;
  std::vector<Branch> branches;
};

// The {{ }} expressions, the {% set name = value %} tags and the string literals of a template.
struct Analysis {
  std::vector<Located> exprs, sets;
  std::vector<std::string> literals;
};

std::string without_spaces(const std::string& s) {
  std::string out;
  for (char c : s)
    if (!is_space(c)) out += c == '"' ? '\'' : c;
  return out;
}

// A condition that tests a message's role, e.g. message['role'] == 'system' (who: "message", "messages[0]").
bool tests_role(const std::string& cond, const std::string& role, bool first_message_only) {
  const std::string who = first_message_only ? R"(messages\[0\])" : R"((?:messages\[0\]|message))";
  return !Regex(who + R"((?:\.role|\[\s*['"]role['"]\s*\])\s*==\s*['"])" + role + R"(['"])").find_all(cond).empty();
}

template <typename Pred>
bool enclosed_by(const std::vector<Branch>& branches, Pred pred, bool negated = false) {
  return std::any_of(branches.begin(), branches.end(),
                     [&](const Branch& b) { return b.negated == negated && pred(b.cond); });
}

// Inside a branch taken only for assistant or tool messages, which kiln never renders.
bool in_other_role_branch(const std::vector<Branch>& branches) {
  return enclosed_by(branches, [](const std::string& c) {
    return !contains(c, " or ") && (tests_role(c, "assistant", false) || tests_role(c, "tool", false));
  });
}

// The text of a message as the templates spell it: the content itself, the first text block, the joined
// text blocks, or '' (the non-string fallback). With one text block all of these are kiln's content.
bool is_content_expression(const std::string& value) {
  static const Regex direct(R"([A-Za-z_]\w*(?:\[0\])?(?:\.content|\['content'\])(?:\[0\](?:\.text|\['text'\]))?)");
  static const Regex joined(R"([A-Za-z_]\w*(?:\[0\])?(?:\.content|\['content'\])\|selectattr\('type','equalto','text'\)\|map\(attribute='text'\)\|join\(''\))");
  const std::string v = without_spaces(value);
  return v == "''" || direct.full_match(v) || joined.full_match(v);
}

// Whether `var` (the X of '[INST]' + X + '[/INST]' and the like) is the message's text: a content expression,
// or a name every {% set %} of which is one (sets inside assistant/tool branches do not matter; a set in the
// {% else %} of a system-role test is the template's default system message, reported in *default_system).
bool is_content(const std::string& var, const Analysis& a, bool* default_system) {
  if (is_content_expression(var)) return true;
  bool any = false;
  for (const auto& s : a.sets) {
    const size_t eq = s.body.find('=');
    if (trim(s.body.substr(0, eq)) != var || in_other_role_branch(s.branches)) continue;
    any = true;
    const std::string value = trim(s.body.substr(eq + 1));
    if (is_content_expression(value)) continue;
    if (enclosed_by(s.branches, [](const std::string& c) { return tests_role(c, "system", false); }, true)) {
      if (default_system != nullptr) *default_system = true;
      continue;
    }
    return false;
  }
  return any;
}

// The X of every `<prefix> X <suffix>` (X a variable access) in the expressions outside assistant/tool branches.
std::vector<std::pair<std::string, const Located*>> wrapped_vars(const Analysis& a, const std::string& prefix,
                                                                 const std::string& suffix) {
  std::vector<std::pair<std::string, const Located*>> out;
  const Regex whole(prefix + kVar + suffix), head(prefix), tail(suffix);
  for (const auto& e : a.exprs) {
    if (in_other_role_branch(e.branches)) continue;
    for (const auto& [b, end] : whole.find_all(e.body)) {
      const std::string m = e.body.substr(b, end - b);
      const size_t from = head.find_all(m).front().second, to = tail.find_all(m.substr(from)).back().first + from;
      out.emplace_back(trim(m.substr(from, to - from)), &e);
    }
  }
  return out;
}

Analysis analyse(const std::vector<Piece>& pieces, const std::function<void(const std::string&)>& refuse) {
  Analysis a;
  std::vector<Branch> branches;
  for (const Piece& p : pieces) {
    if (p.type == Piece::text || p.type == Piece::comment) continue;
    for (auto& l : string_literals(p.body)) a.literals.push_back(std::move(l));
    if (p.type == Piece::expr) {
      a.exprs.push_back({trim(p.body), branches});
      continue;
    }
    const std::string w = first_word(p.body);
    const std::string rest = trim(trim(p.body).substr(w.size()));
    if (w == "raw" || w == "include" || w == "import" || w == "from" || w == "extends") refuse("it uses {% " + w + " %}");
    if (w == "if" || w == "for") {
      branches.push_back({w == "if" ? rest : "for " + rest});
    } else if (w == "elif" && !branches.empty()) {
      branches.back() = {rest};
    } else if (w == "else" && !branches.empty()) {
      branches.back().negated = true;
    } else if (w == "set" && contains(rest, "=")) {
      a.sets.push_back({rest, branches});
    } else if (w == "set" || w == "macro" || w == "call" || w == "filter" || w == "with" || w == "block" ||
               w == "generation") {
      branches.push_back({w});
    } else if (w.rfind("end", 0) == 0 && !branches.empty()) {
      branches.pop_back();
    }
  }
  return a;
}

// At most about `n` bytes of `s`, cut at a UTF-8 character boundary, for messages.
std::string clip(const std::string& s, size_t n = 60) {
  if (s.size() <= n) return s;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n) + "...";
}
std::string quoted(const std::string& s) {
  return nlohmann::json(clip(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

void ChatTemplate::unsupported(const std::string& why) const { fail("tokenizer", source_, ": ", kFamilies, why); }

ChatTemplate ChatTemplate::from_string(std::string text, std::string source, std::optional<std::string> bos_token,
                                       std::optional<std::string> eos_token) {
  ChatTemplate c;
  c.text_ = std::move(text);
  c.source_ = std::move(source);
  c.bos_token_ = std::move(bos_token);
  c.eos_token_ = std::move(eos_token);
  auto refuse = [&c](const std::string& why) { c.unsupported(why); };

  // Jinja reads "\r\n" and "\r" as "\n" and drops one trailing newline (keep_trailing_newline=False).
  std::string normalized;
  normalized.reserve(c.text_.size());
  for (size_t i = 0; i < c.text_.size(); ++i) {
    normalized += c.text_[i] == '\r' ? '\n' : c.text_[i];
    if (c.text_[i] == '\r' && i + 1 < c.text_.size() && c.text_[i + 1] == '\n') ++i;
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  std::vector<Piece> pieces;
  if (auto err = lex(normalized, pieces)) refuse(*err);
  // Rule 1: no output outside expressions.
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (pieces[k].type != Piece::text) continue;
    const std::string out = emitted_text(pieces, k);
    if (!out.empty()) refuse("it emits text outside {{ }} expressions: " + quoted(out));
  }
  const Analysis a = analyse(pieces, refuse);

  // Rule 2: one family.
  const bool mistral = contains(c.text_, "[INST]"), chatml = contains(c.text_, "<|im_start|>");
  if (mistral == chatml)
    refuse(mistral ? "it has both [INST] and <|im_start|> markers" : "it has neither [INST] nor <|im_start|>");
  c.family_ = mistral ? Family::mistral : Family::chatml;
  c.reads_generation_prompt_ = contains(c.text_, "add_generation_prompt");
  const bool reads_thinking = contains(c.text_, "enable_thinking");
  auto system_test = [](const std::string& cond) { return tests_role(cond, "system", false); };

  if (c.family_ == Family::mistral) {
    // Rule 3.
    if (a.exprs.empty() || a.exprs[0].body != "bos_token") refuse("its first {{ }} expression is not bos_token");
    if (!a.exprs[0].branches.empty()) refuse("its bos_token is inside an {% if %} or {% for %}");
    bool default_system = contains(c.text_, "default_system_message");
    const auto systems = wrapped_vars(a, R"('\[SYSTEM_PROMPT\]'\s*\+\s*)", R"(\s*\+\s*'\[/SYSTEM_PROMPT\]')");
    if (systems.empty()) refuse("it has no '[SYSTEM_PROMPT]' + ... + '[/SYSTEM_PROMPT]' expression");
    for (const auto& [var, e] : systems) {
      if (!is_content(var, a, &default_system))
        refuse("its '[SYSTEM_PROMPT]' + " + var + " + '[/SYSTEM_PROMPT]' is not the system message's text");
      if (!enclosed_by(e->branches, system_test)) default_system = true;  // emitted whether or not one is given
    }
    const auto users = wrapped_vars(a, R"('\[INST\]'\s*\+\s*)", R"(\s*\+\s*'\[/INST\]')");
    if (users.empty()) refuse("it has no '[INST]' + ... + '[/INST]' expression");
    for (const auto& [var, e] : users)
      if (!is_content(var, a, nullptr)) refuse("its '[INST]' + " + var + " + '[/INST]' is not the user message's text");
    for (const auto& l : a.literals)
      for (const char* marker : {"[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"})
        if (contains(l, marker) && l != marker) refuse("the string " + quoted(l) + " puts text around " + marker);
    if (reads_thinking) refuse("it reads enable_thinking, which Mistral templates do not");
    c.has_default_system_ = default_system;
    return c;
  }

  // Rule 4: Qwen ChatML.
  const auto users = wrapped_vars(
      a, R"('<\|im_start\|>'\s*\+\s*message(?:\.role|\[\s*['"]role['"]\s*\])\s*\+\s*)" + kNl + R"(\s*\+\s*)",
      R"(\s*\+\s*(?:'<\|im_end\|>'\s*\+\s*)" + kNl + R"(|'<\|im_end\|>(?:\\n|\n)'))");
  if (users.empty()) refuse("it has no '<|im_start|>' + message.role + '\\n' + ... + '<|im_end|>' + '\\n' expression");
  for (const auto& [var, e] : users)
    if (!is_content(var, a, nullptr)) refuse("its user turn prints " + var + ", not the message's text");
  for (const auto& l : a.literals)
    if (contains(l, "<|im_start|>") && l != "<|im_start|>" && l != "<|im_start|>system\n" && l != "<|im_start|>user" &&
        l != "<|im_start|>assistant\n")
      refuse("the string " + quoted(l) + " is not one of the ChatML pieces kiln renders (a default system prompt?)");
  if (contains(c.text_, "bos_token")) refuse("it uses bos_token, which Qwen ChatML templates do not");
  const Regex system_form(R"('<\|im_start\|>system(?:\\n|\n)'\s*\+\s*)" + kVar + R"(\s*\+\s*'<\|im_end\|>(?:\\n|\n)')");
  const Regex bare_system(R"('<\|im_start\|>system(?:\\n|\n)')");
  const Regex assistant_prompt(R"('<\|im_start\|>assistant(?:\\n|\n)')");
  const Regex no_think(R"('<think>(?:\\n|\n)(?:\\n|\n)</think>(?:\\n|\n)(?:\\n|\n)')");
  const Regex open_think(R"('<think>(?:\\n|\n)')");
  auto first_system = [](const std::string& cond) { return tests_role(cond, "system", true); };
  auto is_tools = [](const std::string& cond) { return cond == "tools" || cond.rfind("tools ", 0) == 0; };
  for (const auto& e : a.exprs) {
    if (in_other_role_branch(e.branches)) continue;
    if (contains(e.body, "<|im_start|>system")) {
      // Every system turn is either the given system message or part of the tools preamble (no tools here).
      if (system_form.full_match(e.body) && enclosed_by(e.branches, first_system)) {
        const size_t first = e.body.find('+'), last = e.body.rfind('+');  // X has no '+'
        if (is_content(trim(e.body.substr(first + 1, last - first - 1)), a, nullptr)) c.has_system_expr_ = true;
      } else if (!(bare_system.full_match(e.body) && enclosed_by(e.branches, is_tools))) {
        refuse("it emits a system turn from {{ " + clip(e.body) +
               " }}, which kiln does not model (a default system prompt?)");
      }
    }
    auto other_generation_test = [](const std::string& cond) {
      return contains(cond, "add_generation_prompt") && cond != "add_generation_prompt";
    };
    if (enclosed_by(e.branches, other_generation_test) || enclosed_by(e.branches, other_generation_test, true) ||
        enclosed_by(e.branches, [](const std::string& cond) { return cond == "add_generation_prompt"; }, true))
      refuse("it emits {{ " + clip(e.body) + " }} under a condition on add_generation_prompt kiln does not model");
    if (!enclosed_by(e.branches, [](const std::string& cond) { return cond == "add_generation_prompt"; })) continue;
    // The generation prompt: '<|im_start|>assistant\n' and Qwen3's enable_thinking switch, nothing else.
    if (assistant_prompt.full_match(e.body)) {
      c.has_assistant_prompt_ = true;
    } else if (no_think.full_match(e.body) &&
               enclosed_by(e.branches, [](const std::string& cond) {
                 return cond == "enable_thinking is defined and enable_thinking is false";
               })) {
      c.has_think_switch_ = true;
    } else if (open_think.full_match(e.body)) {
      c.has_open_think_ = true;
    } else {
      refuse("its generation prompt emits {{ " + clip(e.body) + " }}, which kiln does not model");
    }
  }
  if ((contains(c.text_, "<think>") || reads_thinking) && !c.has_think_switch_)
    refuse("it mentions <think> or enable_thinking without Qwen3's switch ({% if enable_thinking is defined and "
           "enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }})");
  return c;
}

ChatTemplate ChatTemplate::from_pretrained(const fs::path& dir) {
  check_folder(dir, "tokenizer");
  const auto config = TokenizerConfig::load(dir);
  std::error_code ec;
  std::string text, source;
  if (fs::exists(dir / "chat_template.jinja", ec)) {
    source = (dir / "chat_template.jinja").string();
    text = read_file(dir / "chat_template.jinja", "chat template");
  } else if (fs::exists(dir / "chat_template.json", ec)) {
    source = (dir / "chat_template.json").string();
    const auto j = read_json(dir / "chat_template.json", "chat template");
    KILN_CHECK(j.is_object() && j.contains("chat_template") && j["chat_template"].is_string(), "tokenizer", source,
               ": expected an object with a \"chat_template\" string");
    text = j["chat_template"].get<std::string>();
  } else if (config.config.contains("chat_template") && !config.config["chat_template"].is_null()) {
    source = (dir / "tokenizer_config.json").string();
    const auto& v = config.config["chat_template"];
    if (v.is_string()) {
      text = v.get<std::string>();
    } else {
      KILN_CHECK(v.is_array(), "tokenizer", source, ": chat_template is ", io::json_kind(v),
                 ", expected a string or a list of {\"name\", \"template\"}");
      bool found = false;
      for (const auto& t : v)
        if (t.is_object() && json_string(t, "name", "") == "default" && t.contains("template") &&
            t["template"].is_string()) {
          text = t["template"].get<std::string>();
          found = true;
        }
      KILN_CHECK(found, "tokenizer", source, ": chat_template is a list without a \"default\" template");
    }
  } else {
    fail("tokenizer", dir.string(), ": no chat template (looked for chat_template.jinja, chat_template.json and ",
         "tokenizer_config.json's \"chat_template\")");
  }
  return from_string(std::move(text), std::move(source), config.special_token("bos_token"),
                     config.special_token("eos_token"));
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 bool enable_thinking) const {
  const bool with_system = !messages.empty() && messages[0].role == "system";
  const bool shape_ok = messages.size() == size_t(with_system ? 2 : 1) && messages.back().role == "user";
  if (!shape_ok) {
    std::string roles;
    for (const auto& m : messages) roles += (roles.empty() ? "" : ", ") + m.role;
    fail("tokenizer", source_, ": kiln renders one optional system message followed by one user message, got [",
         roles, "]");
  }
  const std::string& user = messages.back().content;
  std::string out;
  if (family_ == Family::mistral) {
    if (!with_system && has_default_system_)
      unsupported("it inserts a default system message when none is given; pass a system message");
    if (add_generation_prompt && reads_generation_prompt_)
      unsupported("it reads add_generation_prompt, which kiln does not model for Mistral templates");
    KILN_CHECK(bos_token_.has_value(), "tokenizer", source_, ": the chat template starts with bos_token but the ",
               "folder sets no bos_token");
    out = *bos_token_;
    if (with_system) out += "[SYSTEM_PROMPT]" + messages[0].content + "[/SYSTEM_PROMPT]";
    out += "[INST]" + user + "[/INST]";
    return out;
  }
  if (with_system) {
    if (!has_system_expr_)
      unsupported("a system message needs '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n'");
    out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
  }
  out += "<|im_start|>user\n" + user + "<|im_end|>\n";
  if (add_generation_prompt) {
    if (!has_assistant_prompt_ || !reads_generation_prompt_)
      unsupported("add_generation_prompt needs the literal '<|im_start|>assistant\\n' under add_generation_prompt");
    out += "<|im_start|>assistant\n";
    if (has_think_switch_ && !enable_thinking) out += "<think>\n\n</think>\n\n";
    if (has_open_think_ && enable_thinking)
      unsupported("it opens a '<think>\\n' block that kiln does not model; render with enable_thinking=false");
  }
  return out;
}

}  // namespace kiln::tokenizers
