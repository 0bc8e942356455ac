// The bad-input corpus: damaged checkpoints, flags, outputs and environments, each run through
// the real `kiln` binary (the normal build and the ASan+UBSan one). A case names the arguments,
// the exit code and the key words its message must hold; the runner also checks that the
// watched folder (outputs, models) is exactly as before the run — nothing created, replaced
// or left behind — and that no sanitizer report or "internal error" appears.
//
// Everything a case needs is made at run time in a scratch folder, from the fixtures: no
// damaged binaries are committed.
#pragma once
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::corpus {

namespace fs = std::filesystem;

struct Case {
  std::string name;               // "outputs/fifo": class/what
  std::vector<std::string> args;  // after "kiln"
  std::vector<std::string> env;   // "NAME=value", added to the runner's environment
  int exit_code = 1;
  std::vector<std::string> expect;  // substrings the combined stdout+stderr must contain
  std::vector<std::string> forbid;  // substrings it must not contain (besides the runner's own list)
  std::vector<fs::path> watch;      // folders whose trees must be unchanged; empty: the corpus's out_dir and models
  // A value bounded before any work: the case must end within the runner's --fast-timeout
  // (10 s by default, against --timeout's 120), so work in proportion to the value fails it.
  bool fast = false;
};

// A case expecting `exit_code` and every one of `expect` in its output.
inline Case expecting(int exit_code, std::string name, std::vector<std::string> args, std::vector<std::string> expect,
                      std::vector<std::string> env = {}, std::vector<std::string> forbid = {}) {
  Case c;
  c.name = std::move(name);
  c.args = std::move(args);
  c.env = std::move(env);
  c.exit_code = exit_code;
  c.expect = std::move(expect);
  c.forbid = std::move(forbid);
  return c;
}

// A case that must fail (exit code 1) with every one of `expect` in its output.
inline Case failing(std::string name, std::vector<std::string> args, std::vector<std::string> expect,
                    std::vector<std::string> env = {}, std::vector<std::string> forbid = {}) {
  return expecting(1, std::move(name), std::move(args), std::move(expect), std::move(env), std::move(forbid));
}

class Corpus {
 public:
  Corpus(fs::path scratch, fs::path fixtures);

  const fs::path& scratch() const { return scratch_; }
  const fs::path& fixtures() const { return fixtures_; }
  // scratch/out: where cases point --out and --report, watched by default.
  fs::path out_dir() const { return scratch_ / "out"; }
  fs::path models_dir() const { return scratch_ / "models"; }
  // The small FLUX.1 fixture (flux1_tiny: 32x32, 2 steps) and the bundled one (flux1_tiny_arch).
  fs::path tiny_model() const { return fixtures_ / "flux1_tiny" / "pipeline"; }
  fs::path arch_model() const { return fixtures_ / "flux1_tiny_arch" / "pipeline"; }

  // A full copy of `from` (a pipeline folder) under models/NAME, to damage.
  fs::path copy_model(const std::string& name, const fs::path& from);
  // A copy of the tiny model under models/NAME whose large files (weights, the T5 vocabulary)
  // are symlinks to the fixture's, except `damaged` (paths inside the model), which are real
  // copies, as are all small files (configs): the watched models folder stays small, so every
  // case's before/after snapshot of it stays quick.
  fs::path sparse_copy(const std::string& name, const std::vector<std::string>& damaged);
  // write_safetensors into a sparse copy, refusing a symlink (which would overwrite the fixture).
  static void rewrite_safetensors(const fs::path& file, const nlohmann::json& header, const std::string& data);
  // Reads, edits and rewrites a JSON file.
  static void edit_json(const fs::path& file, const std::function<void(nlohmann::json&)>& edit);
  // A safetensors file's header (JSON) and data section, and one written from them exactly as
  // given (the header padded with spaces to 8 bytes), so cases can damage either.
  static std::pair<nlohmann::json, std::string> read_safetensors(const fs::path& file);
  static void write_safetensors(const fs::path& file, const nlohmann::json& header, const std::string& data);

  // generate on the tiny model at 32x32 with one step, writing into out_dir(); `extra` follow.
  std::vector<std::string> generate(const fs::path& model, std::vector<std::string> extra = {}) const;

  void add(Case c);
  const std::vector<Case>& cases() const { return cases_; }

 private:
  fs::path scratch_, fixtures_;
  std::vector<Case> cases_;
};

// One function per class of bad input (tests/bad_input/cases_*.cc).
void add_output_cases(Corpus& corpus);      // --out / --report targets
void add_hub_cache_cases(Corpus& corpus);   // names in indexes and model_index
void add_value_cases(Corpus& corpus);       // NaN/Inf weights, latents, scalars, configs
void add_checkpoint_cases(Corpus& corpus);  // dtypes, byte layout, unused tensors, classes, env
void add_size_cases(Corpus& corpus);        // sizes that exhaust memory
void add_cli_cases(Corpus& corpus);         // flags, help
void add_bound_cases(Corpus& corpus);       // steps, sizes, counts, tiles, PNG sizes bounded before work
void add_input_cases(Corpus& corpus);       // FIFOs, sockets, devices, folders read as files; GGUF by magic

}  // namespace kiln::corpus
