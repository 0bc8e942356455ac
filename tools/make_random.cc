// `kiln make-random DIR --like flux1-schnell|flux1-dev|sd3-medium|sd3.5-medium|flux2-dev|
// flux2-klein-4b|flux2-klein-9b`: a real-size FLUX.1, Stable Diffusion 3 / 3.5 Medium or FLUX.2
// folder with deterministic random weights, for speed and memory measurements without the
// download. The work is random_checkpoint/like_recipe.h (the checkpoints as data) and
// random_folder.h; this file reads the flags, finds the bundled tokenizers and prints the summary.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "io/kiln_files.h"
#include "help.h"
#include "random_like.h"
#include "core/error.h"
#include "core/terminal.h"
#include "random_checkpoint/like_recipe.h"

namespace kiln::cli {

namespace {

namespace rw = random_weights;

// 1234567 -> "1,234,567"
std::string grouped(uint64_t v) {
  const std::string digits = std::to_string(v);
  std::string s;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1ull << 30));
  return buf;
}

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}

DType parse_weights_dtype(const std::string& v) {
  for (DType t : {DType::bf16, DType::f16, DType::f32})
    if (v == dtype_name(t)) return t;
  fail("cli", "--dtype ", v, ": expected bf16, f16 or f32");
}

void print_component(const rw::WrittenComponent& c, double seconds) {
  std::printf("  %-15s %6lld tensors %16s parameters %17s bytes (%s) %2zu files %7.1f s\n", c.folder.c_str(),
              static_cast<long long>(c.tensors), grouped(uint64_t(c.parameters)).c_str(), grouped(c.bytes).c_str(),
              gib(c.bytes).c_str(), c.files.size(), seconds);
  std::fflush(stdout);
}

// A depth flag of any recipe (--blocks, --t5-layers, ...), read once --like says which one.
bool some_recipe_has_depth(const std::string& flag) {
  for (const rw::LikeRecipe& r : rw::like_recipes())
    if (r.depth(flag)) return true;
  return false;
}

}  // namespace

rw::RandomFolder write_random_like(const RandomLike& s, const rw::RandomFolderProgress& progress, std::string* what,
                                   std::string* note) {
  const rw::LikeRecipe& recipe = rw::like_recipe(s.like);
  rw::RandomLikeOptions o{s.like, {}, s.dtype, s.seed, s.layout_only};
  for (const auto& [flag, value] : s.depths) o.depths[flag] = rw::parse_like_depth(recipe, flag, value);
  *what = rw::like_summary(o);
  // A text encoder shallower than the pipeline's default hidden-state layers is allowed (a
  // shallow folder is what a quick benchmark wants), but the default call needs more.
  if (!recipe.text_encoder_out_layers.empty()) {
    const int64_t layers = rw::like_depth(o, *recipe.depth("--text-encoder-layers")).at(0),
                  needed = recipe.text_encoder_out_layers.back();
    if (layers < needed) {
      const std::vector<int64_t> example{std::max<int64_t>(0, layers - 2), std::max<int64_t>(0, layers - 1), layers};
      *note = "kiln: note: the pipeline's default text_encoder_out_layers (" + join(recipe.text_encoder_out_layers) +
              ") need " + std::to_string(needed) + " text encoder layers; generate with three hidden-state indices of "
              "at most " + std::to_string(layers) + ", e.g. --text-encoder-out-layers " + join(example) + "\n";
    }
  }
  // The fixtures folder holds the bundled checkpoint (FIXTURES/flux1_tiny_arch/pipeline).
  const std::filesystem::path fixtures = io::kiln_fixtures_dir();
  return rw::write_random_folder(s.dir, rw::like_contents(o, fixtures), progress);
}

int make_random(const std::vector<std::string>& args) {
  std::optional<std::string> dir, like;
  std::map<std::string, std::string> depths;  // read once --like is known: --blocks is D+S for FLUX, N for SD3
  DType dtype = DType::bf16;
  uint64_t seed = 0;
  bool layout_only = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (!flag.starts_with("--")) {
      KILN_CHECK(!dir, "cli", "make-random writes one folder, got '", dir.value_or(""), "' and '", flag, "'");
      dir = flag;
      continue;
    }
    auto value = [&]() -> const std::string& {
      KILN_CHECK(i + 1 < args.size(), "cli", "flag ", flag, " needs a value");
      return args[++i];
    };
    if (flag == "--like") {
      const std::string& v = value();
      KILN_CHECK(rw::is_like_name(v), "cli", "--like ", v, ": expected ", rw::like_names_by_family());
      like = v;
    } else if (some_recipe_has_depth(flag)) {
      KILN_CHECK(!depths.count(flag), "cli", flag, " is given twice");
      depths[flag] = value();
    } else if (flag == "--dtype") {
      dtype = parse_weights_dtype(value());
    } else if (flag == "--layout-only") {
      layout_only = true;
    } else if (flag == "--seed") {
      const int64_t s = parse_int(flag, value());
      KILN_CHECK(s >= 0, "cli", "--seed must be >= 0, got ", s);
      seed = uint64_t(s);
    } else {
      unknown_flag("make-random", flag);
    }
  }
  KILN_CHECK(dir, "cli",
             "make-random needs the folder to write, e.g. kiln make-random /tmp/flux1 --like flux1-schnell");
  KILN_CHECK(like, "cli", "make-random needs --like NAME: ", rw::like_names_by_family());

  const auto t0 = std::chrono::steady_clock::now();
  rw::RandomFolderProgress progress;
  bool started = false;
  std::string what, note;  // "(...)" of the first line; a line after it
  progress.starting = [&](const rw::WrittenComponent&) {  // the folder passed every check
    if (std::exchange(started, true)) return;
    print_line(stdout, "kiln: writing a random %s folder (%s, %s, seed %llu) to %s", like->c_str(), what.c_str(),
               dtype_name(dtype), static_cast<unsigned long long>(seed), dir->c_str());
    std::fputs(note.c_str(), stdout);
    std::fflush(stdout);
  };
  progress.written = print_component;
  RandomLike spec{*dir, *like, depths, dtype, seed, layout_only};
  const rw::RandomFolder folder = write_random_like(spec, progress, &what, &note);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t tensors = 0;
  for (const rw::WrittenComponent& c : folder.components) tensors += c.tensors;
  std::printf("  %-15s %14s %27s %17s bytes (%s)  configs, scheduler, tokenizers\n", "other", "", "",
              grouped(folder.other_bytes).c_str(), gib(folder.other_bytes).c_str());
  print_line(stdout, "kiln: wrote %s: %lld tensors, %s parameters, %s bytes (%s) in %.1f s", dir->c_str(),
              static_cast<long long>(tensors), grouped(uint64_t(folder.total_parameters())).c_str(),
              grouped(folder.total_bytes()).c_str(), gib(folder.total_bytes()).c_str(), seconds);
  return 0;
}

}  // namespace kiln::cli
