// Subcommands of the `kiln` CLI. Each takes its arguments (after the subcommand name) and
// returns the process exit code; errors are thrown as kiln::Error and printed by main.
#pragma once
#include <string>
#include <vector>

namespace kiln::cli {

int inspect(const std::vector<std::string>& args);
int generate(const std::vector<std::string>& args);

}  // namespace kiln::cli
