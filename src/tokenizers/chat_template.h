// The chat template of a tokenizer folder, rendered the way transformers' apply_chat_template renders
// it for the messages the FLUX.2 pipelines send: one optional system message, then one user message.
//
//   auto tmpl = ChatTemplate::from_pretrained(root / "tokenizer");
//   std::string text = tmpl.render({{"system", sys}, {"user", prompt}}, /*add_generation_prompt=*/false);
//
// Where the template comes from (transformers' precedence): chat_template.jinja, else chat_template.json
// ({"chat_template": "..."}, a processor's file), else tokenizer_config.json's "chat_template" (a string,
// or a list of {"name", "template"} from which "default" is taken). bos_token / eos_token are the
// folder's special tokens (special_tokens_map.json over tokenizer_config.json).
//
// kiln does not run Jinja. It recognises two template families and renders them in C++:
//  - Mistral (FLUX.2-dev): "<bos>[SYSTEM_PROMPT]{system}[/SYSTEM_PROMPT][INST]{user}[/INST]".
//  - Qwen ChatML (FLUX.2 klein): "<|im_start|>system\n{system}<|im_end|>\n" (only when a system message is
//    given) "<|im_start|>user\n{user}<|im_end|>\n", then with add_generation_prompt
//    "<|im_start|>assistant\n" and, with enable_thinking=false, "<think>\n\n</think>\n\n".
// Without an engine kiln cannot evaluate a template, so recognition is by the exact pieces the rendering
// emits and the branches (the enclosing {% if %}/{% elif %}/{% else %}/{% for %} conditions, read as text)
// they sit in. A template that fails any rule is an error naming its file ("... chat_template is not one
// kiln can render (it renders Mistral [INST]/[SYSTEM_PROMPT] templates and Qwen ChatML templates); <the
// rule>"), never a silently different text. "X is the message's text" below means X is a content access
// (message.content, message['content'], messages[0]['content'][0]['text'], the joined text blocks
// `... | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('')`) or a name every
// {% set %} of which, outside assistant/tool branches, is one (so |trim or a macro over the content is
// refused). The rules:
//  1. Every piece of text outside {{ }} / {% %} / {# #} tags is whitespace that Jinja drops (with
//     transformers' trim_blocks and lstrip_blocks, and "-" whitespace control), so all output comes from
//     expressions; {% raw %}, include, import, extends are not allowed.
//  2. Exactly one family's marker occurs: "[INST]" (Mistral) or "<|im_start|>" (ChatML).
//  3. Mistral: the first {{ }} expression is `bos_token`, outside any {% if %}/{% for %}; the template has
//     '[SYSTEM_PROMPT]' + X + '[/SYSTEM_PROMPT]' and '[INST]' + X + '[/INST]' with X the message's text;
//     every string literal that contains a marker ([INST], [/INST], [SYSTEM_PROMPT], [/SYSTEM_PROMPT]) is
//     exactly that marker (no spaces or newlines around it); a template that reads enable_thinking is
//     refused. Rendering without a system message is refused when the template has a default one (a
//     [SYSTEM_PROMPT] expression outside a role == 'system' branch, a {% set %} of its X in the {% else %}
//     of one, or a default_system_message); add_generation_prompt=true is refused when the template reads
//     add_generation_prompt.
//  4. ChatML: the template has '<|im_start|>' + message.role + '\n' + X + '<|im_end|>' + '\n' (or
//     message['role'], or '<|im_end|>\n') with X the message's text; every string literal containing
//     "<|im_start|>" is one of '<|im_start|>', '<|im_start|>system\n', '<|im_start|>user',
//     '<|im_start|>assistant\n'; every expression that emits "<|im_start|>system" (outside assistant/tool
//     branches) is either '<|im_start|>system\n' + X + '<|im_end|>\n' with X the message's text inside a
//     messages[0] role == 'system' branch (needed to render a system message) or the bare
//     '<|im_start|>system\n' inside an {% if tools %} branch (no default system prompt); bos_token does not
//     occur; under {% if add_generation_prompt %} the only expressions are '<|im_start|>assistant\n'
//     (needed for add_generation_prompt=true), '<think>\n\n</think>\n\n' inside {% if enable_thinking is
//     defined and enable_thinking is false %} (Qwen3's switch) and '<think>\n' (an always-open think block:
//     enable_thinking=true is then refused), and no other condition mentions add_generation_prompt; a
//     template that mentions <think> or enable_thinking must have Qwen3's switch.
// Messages other than [system?, user] (assistant turns, several users) are refused for both families.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace kiln::tokenizers {

struct ChatMessage {
  std::string role;     // "system" or "user"
  std::string content;  // the text (one text block of a multimodal content list)
};

class ChatTemplate {
 public:
  enum class Family { mistral, chatml };

  // The template of a tokenizer (or processor) folder; no template is an error naming the folder.
  static ChatTemplate from_pretrained(const std::filesystem::path& dir);
  // A template text; `source` names it in errors (e.g. "tokenizer/tokenizer_config.json").
  static ChatTemplate from_string(std::string text, std::string source, std::optional<std::string> bos_token,
                                  std::optional<std::string> eos_token);

  Family family() const { return family_; }
  const std::string& source() const { return source_; }
  const std::string& text() const { return text_; }
  const std::optional<std::string>& bos_token() const { return bos_token_; }
  const std::optional<std::string>& eos_token() const { return eos_token_; }

  // apply_chat_template(messages, tokenize=False, add_generation_prompt, enable_thinking); enable_thinking
  // true renders as a template that is not passed the flag.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     bool enable_thinking = true) const;

 private:
  ChatTemplate() = default;
  [[noreturn]] void unsupported(const std::string& why) const;

  Family family_ = Family::mistral;
  std::string text_, source_;
  std::optional<std::string> bos_token_, eos_token_;
  // What the rules of the header found in the template.
  bool reads_generation_prompt_ = false, has_default_system_ = false, has_system_expr_ = false;
  bool has_assistant_prompt_ = false, has_think_switch_ = false, has_open_think_ = false;
};

}  // namespace kiln::tokenizers
