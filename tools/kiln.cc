// The `kiln` command-line tool.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "commands.h"
#include "core/error.h"
#include "distributed/process_group.h"

namespace {

void usage(std::FILE* out) {
  std::fprintf(out,
               "kiln %s — diffusion pipelines in C++\n\n"
               "usage: kiln <command> [options]\n\n"
               "commands:\n"
               "  generate [--model DIR] [--prompt TEXT] [--prompt-2 TEXT] [--height H] [--width W]\n"
               "           [--steps N] [--guidance G] [--max-sequence-length N] [--seed S]\n"
               "           [--latents FILE] [--out out.png] [--report run.json] [--device cpu]\n"
               "           [--mode eager|defer|compile] [--compile full|blocks] [--prepack on|off]\n"
               "           [--offload none|model] [--device-memory SIZE] [--tp N]\n"
               "      Text to image with a FLUX.1 checkpoint in Diffusers layout (FluxPipeline). Without\n"
               "      --model it runs the small FLUX.1 checkpoint bundled with kiln (128x128, 4 steps).\n"
               "      --mode eager runs each op as its own kernel (the default); --mode defer records ops\n"
               "      and runs them as fused, cached graphs (same image, fewer kernels); --mode compile\n"
               "      runs the transformer as compiled executables, one per image size: --compile full\n"
               "      (the whole transformer, the default) or blocks (compile_repeated_blocks); its linears\n"
               "      read their weights pre-packed for the GEMM (--prepack off: one less copy of them).\n"
               "      Weights stay on the host (read in place) unless --offload none (all on the device)\n"
               "      or --offload model (each component on the device only while it runs);\n"
               "      --device-memory 6GiB caps the device, and a call that cannot fit fails before any\n"
               "      work, naming each component's size and what would fit. --tp N shards the\n"
               "      transformer over N processes started by mpirun -np N (rank 0 writes the outputs).\n"
               "  warmup --sizes HxW[,HxW...] [--model DIR] [--compile full|blocks]\n"
               "         [--max-sequence-length N] [--report FILE]\n"
               "      Compile the transformer for each size without running it and store the executables\n"
               "      in the persistent cache, so later runs at those sizes compile nothing.\n"
               "  inspect [--model DIR] [--report FILE]\n"
               "      Load a Diffusers model folder (model_index.json, each component's config and\n"
               "      safetensors weights, zero-copy) and print what it holds. Without --model it\n"
               "      uses the small FLUX.1 checkpoint bundled with kiln.\n"
               "  --version   print the engine version\n"
               "  --help      this text\n\n"
               "environment (read once at start):\n"
               "  KILN_DEFER_AND_FUSE=1   deferred-and-fused mode by default (--mode overrides it)\n"
               "  KILN_LAUNCH_BLOCKING=1  debug eager: wait for every kernel, so errors name the op\n"
               "  KILN_CACHE_DIR=DIR      persistent compile cache (default $XDG_CACHE_HOME/kiln or\n"
               "                          ~/.cache/kiln; 'none' turns it off)\n"
               "  KILN_COLLECTIVE_TIMEOUT=S  --tp: seconds a collective waits for the other ranks before\n"
               "                          the job is aborted with an error naming it (default 300)\n",
               KILN_VERSION);
}

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
    usage(args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::printf("kiln %s\n", KILN_VERSION);
    return 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  try {
    if (command == "inspect") return kiln::cli::inspect(args);
    if (command == "generate") return kiln::cli::generate(args);
    if (command == "warmup") return kiln::cli::warmup(args);
    std::fprintf(stderr, "kiln: unknown command '%s' (see kiln --help)\n", command.c_str());
    return 2;
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln: %s\n", e.what());
    abort_other_ranks();
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln: internal error: %s\n", e.what());
    abort_other_ranks();
    return 1;
  }
}
