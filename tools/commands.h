// Subcommands of the `kiln` CLI. Each takes its arguments (after the subcommand name) and
// returns the process exit code; errors are thrown as kiln::Error and printed by main.
#pragma once
#include <string>
#include <vector>

namespace kiln {
class FluxPipeline;
}

namespace kiln::cli {

int inspect(const std::vector<std::string>& args);
int generate(const std::vector<std::string>& args);
int warmup(const std::vector<std::string>& args);

// Shared by generate and warmup (generate.cc).
int64_t parse_int(const std::string& flag, const std::string& value);  // "[cli] flag X expects an integer"
size_t parse_bytes(const std::string& flag, const std::string& value);  // "6GiB", "512MiB", "2GB", bytes
void check_compile_flag(const std::string& value);                      // "full" or "blocks"
void compile_transformer(FluxPipeline& pipe, const std::string& how, bool prepack_weights = true);   // --compile full|blocks

}  // namespace kiln::cli
