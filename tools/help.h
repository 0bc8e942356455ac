// What `kiln --help` and `kiln <command> --help` print: each command's flags, with their values,
// defaults and meaning, declared once here and printed by one formatter.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

namespace kiln::cli {

struct FlagDoc {
  const char* flag;           // "--height"
  const char* value;          // "H" ("" for a switch)
  const char* default_value;  // "1024 (128 x vae_scale_factor)", "" for none
  const char* meaning;
};

struct CommandDoc {
  const char* name;     // "generate"
  const char* summary;  // one paragraph
  std::vector<FlagDoc> flags;
};

const std::vector<CommandDoc>& commands();
// The command's doc, or nullptr for an unknown name.
const CommandDoc* command_doc(const std::string& name);
// The flag of `doc` closest to `flag` when it looks like a typo of it ("--step" -> "--steps"), or "".
std::string closest_flag(const CommandDoc& doc, const std::string& flag);
// The error for a flag `command` does not take, with that guess and where its flags are listed.
[[noreturn]] void unknown_flag(const std::string& command, const std::string& flag);
// True when the arguments ask for help (--help or -h anywhere).
bool wants_help(const std::vector<std::string>& args);
void print_command_help(const CommandDoc& doc, std::FILE* out);
void print_usage(std::FILE* out);

}  // namespace kiln::cli
