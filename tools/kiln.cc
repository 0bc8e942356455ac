// The `kiln` command-line tool.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "commands.h"
#include "core/env.h"
#include "help.h"
#include "core/error.h"
#include "core/terminal.h"
#include "distributed/process_group.h"

namespace {

// Under mpirun an error on one rank ends the whole job at once (instead of the others waiting
// in their next collective until its timeout).
void abort_other_ranks() {
  try {
    const auto world = kiln::ProcessGroup::world();
    if (world->size() > 1) world->abort(1);
  } catch (...) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    kiln::cli::print_usage(args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::printf("kiln %s\n", KILN_VERSION);
    return 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  if (const kiln::cli::CommandDoc* doc = kiln::cli::command_doc(command); doc && kiln::cli::wants_help(args)) {
    kiln::cli::print_command_help(*doc, stdout);
    return 0;
  }
  try {
    // Every KILN_* variable is checked before any work: a bad value is an error, an unknown name
    // (a typo, most likely) a warning.
    for (const std::string& name : kiln::env::check_all())
      kiln::print_line(stderr, "kiln: warning: %s is not a kiln environment variable (see kiln --help); ignored",
                       name.c_str());
    if (command == "inspect") return kiln::cli::inspect(args);
    if (command == "generate") return kiln::cli::generate(args);
    if (command == "warmup") return kiln::cli::warmup(args);
    if (command == "compare") return kiln::cli::compare(args);
    if (command == "make-random") return kiln::cli::make_random(args);
    if (command == "plan") return kiln::cli::plan(args);
    if (command == "convert") return kiln::cli::convert(args);
    if (command == "serve") return kiln::cli::serve(args);
    if (command == "list") return kiln::cli::list(args);
    kiln::print_line(stderr, "kiln: unknown command '%s' (see kiln --help)", command.c_str());
    return 2;
  } catch (const kiln::Error& e) {
    // What reaches the terminal is escaped (core/terminal.h): a checkpoint's names cannot
    // recolour it or forge lines.
    kiln::print_lines(stderr, "kiln: ", e.what());
    abort_other_ranks();
    return 1;
  } catch (const std::exception& e) {
    kiln::print_line(stderr, "kiln: internal error: %s", e.what());
    abort_other_ranks();
    return 1;
  }
}
