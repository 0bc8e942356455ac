// Bad-input corpus: flags, help and messages.
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "corpus.h"

namespace kiln::corpus {

namespace {


// A safetensors file holding F32 tensors `names`, each [1, 1, 32, 32] of zeros.
void write_tensors(const fs::path& file, const std::vector<std::string>& names) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const std::string& name : names) {
    const size_t begin = data.size();
    data.append(32 * 32 * 4, '\0');
    header[name] = {{"dtype", "F32"},
                    {"shape", nlohmann::json::array({1, 1, 32, 32})},
                    {"data_offsets", nlohmann::json::array({begin, data.size()})}};
  }
  Corpus::write_safetensors(file, header, data);
}

}  // namespace

void add_cli_cases(Corpus& corpus) {
  const fs::path tiny = corpus.tiny_model();
  const auto gen = [&](std::vector<std::string> extra) { return corpus.generate(tiny, std::move(extra)); };
  const std::string no_work = "loading";  // a flag error is reported before the model is read

  // --model "": an empty folder name is refused, not taken as "the bundled checkpoint" (which
  // is what leaving --model out means), by every command.
  const std::vector<std::string> empty_model{"--model \"\"", "expected a model folder"};
  corpus.add(
      expecting(1, "cli/model-empty-generate",
                {"generate", "--model", "", "--prompt", "a cat", "--out", (corpus.out_dir() / "out.png").string()},
                empty_model, {}, {no_work, "no --model given"}));
  corpus.add(expecting(1, "cli/model-empty-inspect", {"inspect", "--model", ""}, empty_model, {},
                       {"no --model given", "loaded in"}));
  corpus.add(expecting(1, "cli/model-empty-warmup", {"warmup", "--model", "", "--sizes", "32x32"}, empty_model, {"KILN_CACHE_DIR=none"},
                       {"no --model given", "compiled"}));

  // Values of generate's flags.
  corpus.add(
      expecting(1, "cli/steps-zero", gen({"--steps", "0"}), {"[cli] --steps must be at least 1, got 0"}, {}, {no_work}));
  corpus.add(expecting(1, "cli/steps-not-integer", gen({"--steps", "1.5"}),
                       {"[cli] flag --steps expects an integer, got '1.5'"}, {}, {no_work}));
  corpus.add(expecting(1, "cli/seed-not-integer", gen({"--seed", "x"}),
                       {"[cli] flag --seed expects an integer from 0 to 18446744073709551615, got 'x'"}, {}, {no_work}));
  corpus.add(expecting(1, "cli/unknown-flag", gen({"--bogus"}), {"unknown flag '--bogus' for generate", "kiln generate --help"}, {},
                       {no_work}));
  corpus.add(expecting(1, "cli/flag-without-value", gen({"--steps"}), {"[cli] flag --steps needs a value"}, {}, {no_work}));

  // --latents: a missing file, a tensor name the file lacks, a file with several tensors.
  const fs::path dir = corpus.scratch() / "cli_latents";
  fs::create_directories(dir);
  const fs::path missing = dir / "missing.safetensors", two = dir / "two.safetensors";
  write_tensors(two, {"a", "b"});
  corpus.add(expecting(1, "cli/latents-missing-file", gen({"--latents", missing.string()}),
                       {missing.string(), "cannot open", "No such file or directory"}));
  corpus.add(expecting(1, "cli/latents-no-such-tensor", gen({"--latents", two.string() + ":nosuch"}),
                       {"--latents " + two.string(), "no tensor 'nosuch'", "(it has a, b)"}));
  corpus.add(expecting(1, "cli/latents-several-tensors-unnamed", gen({"--latents", two.string()}),
                       {"--latents " + two.string(),
                        "expected a tensor named 'latents', a single tensor, or FILE:TENSOR", "one of a, b"}));

  // Help: each command's flags with their defaults, exit 0, nothing written.
  corpus.add(expecting(0, "cli/help-generate", {"generate", "--help"},
                       {"usage: kiln generate", "--model DIR", "--steps N", "--latents FILE[:TENSOR]", "--strict",
                        "(default:", "KILN_DEFER_AND_FUSE"}));
  corpus.add(expecting(0, "cli/help-warmup", {"warmup", "--help"},
                       {"usage: kiln warmup", "--sizes HxW", "--model DIR", "--compile full|blocks", "(default:"}));
  corpus.add(expecting(0, "cli/help-inspect", {"inspect", "--help"},
                       {"usage: kiln inspect", "--model DIR", "--report FILE", "(default:"}));
  corpus.add(expecting(0, "cli/help", {"--help"},
                       {"usage: kiln <command>", "generate ", "warmup ", "inspect ", "kiln <command> --help"}));
  // No command, or an unknown one: usage, exit code 2.
  corpus.add(expecting(2, "cli/no-command", {}, {"usage: kiln <command>", "generate", "warmup", "inspect"}));
  corpus.add(expecting(2, "cli/unknown-command", {"frobnicate"}, {"unknown command 'frobnicate'", "kiln --help"}));
}

}  // namespace kiln::corpus
