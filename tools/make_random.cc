// `kiln make-random DIR --like flux1-schnell|flux1-dev|sd3-medium|sd3.5-medium|flux2-dev|
// flux2-klein-4b|flux2-klein-9b`: a real-size FLUX.1, Stable Diffusion 3 / 3.5 Medium or FLUX.2
// folder with deterministic random weights, for speed and memory measurements without the
// download. The work is random_checkpoint/flux1_random_folder.h, sd3_random_folder.h and
// flux2_random_folder.h; this file reads the flags, finds the bundled tokenizers and prints the
// summary.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "commands.h"
#include "random_like.h"
#include "core/error.h"
#include "core/terminal.h"
#include "random_checkpoint/flux1_random_folder.h"
#include "random_checkpoint/like_names.h"
#include "random_checkpoint/flux2_random_folder.h"
#include "random_checkpoint/sd3_random_folder.h"
#include "random_checkpoint/sd3_transformer_random.h"

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

// "--blocks D+S": double-stream and single-stream block counts.
std::pair<int64_t, int64_t> parse_blocks(const std::string& v) {
  const size_t plus = v.find('+');
  auto part = [&](const std::string& s) {
    KILN_CHECK(!s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos, "cli",
               "--blocks ", v, ": expected D+S, the double-stream and single-stream block counts (e.g. 19+38)");
    const int64_t n = std::stoll(s);
    KILN_CHECK(n <= rw::kMaxRandomLayers, "cli", "--blocks ", v, ": expected D+S with each count from 0 to ",
               rw::kMaxRandomLayers, " (e.g. 19+38)");
    return n;
  };
  KILN_CHECK(plus != std::string::npos, "cli", "--blocks ", v,
             ": expected D+S, the double-stream and single-stream block counts (e.g. 19+38)");
  return {part(v.substr(0, plus)), part(v.substr(plus + 1))};
}

// "--blocks N" (SD3): the transformer block count.
int64_t parse_sd3_blocks(const std::string& v, const std::string& like) {
  KILN_CHECK(!v.empty() && v.size() <= 9 && v.find_first_not_of("0123456789") == std::string::npos, "cli",
             "--blocks ", v, ": expected N, the number of transformer blocks of ", like, " (e.g. 24)");
  const int64_t n = std::stoll(v);
  KILN_CHECK(n >= 1, "cli", "--blocks ", v, ": ", like,
             " needs at least 1 transformer block (the last is the context-pre-only one)");
  KILN_CHECK(n <= rw::kMaxRandomLayers, "cli", "--blocks ", v, ": expected N from 1 to ", rw::kMaxRandomLayers,
             ", the number of transformer blocks of ", like, " (e.g. 24)");
  return n;
}

// The tokenizers a FLUX.2 folder copies: those of kiln's tiny FLUX.2 fixtures, which sit next to
// the bundled FLUX.1 checkpoint (KILN_BUNDLED_MODEL = FIXTURES/flux1_tiny_arch/pipeline).
std::filesystem::path flux2_tokenizers(const std::filesystem::path& bundled, rw::Flux2Variant v) {
  return bundled.parent_path().parent_path() / (rw::is_klein(v) ? "flux2_klein_tiny" : "flux2_tiny") / "pipeline";
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

}  // namespace

rw::RandomFolder write_random_like(const RandomLike& s, const rw::RandomFolderProgress& progress, std::string* what,
                                   std::string* note) {
  const std::optional<rw::Flux2Variant> flux2 = rw::parse_flux2_variant(s.like);
  const std::filesystem::path bundled(KILN_BUNDLED_MODEL);
  if (flux2) {
    rw::Flux2RandomOptions o;
    o.variant = *flux2;
    if (s.blocks) std::tie(o.num_layers, o.num_single_layers) = parse_blocks(*s.blocks);
    o.text_encoder_layers = s.text_encoder_layers;
    o.dtype = s.dtype;
    o.layout_only = s.layout_only;
    o.seed = s.seed;
    const rw::Flux2TransformerRandomConfig tc = rw::flux2_transformer_random_config(o);
    const int64_t layers = rw::flux2_text_encoder_random_config(o).num_hidden_layers,
                  needed = rw::flux2_text_encoder_layers_needed(o.variant);
    *what = std::to_string(tc.num_layers) + "+" + std::to_string(tc.num_single_layers) + " transformer blocks, " +
           std::to_string(layers) + " text encoder layers";
    // Allowed (a shallow folder is what a quick benchmark wants), but the default call needs more.
    if (layers < needed) {
      const std::vector<int64_t> example{std::max<int64_t>(0, layers - 2), std::max<int64_t>(0, layers - 1), layers};
      *note = "kiln: note: the pipeline's default text_encoder_out_layers (" +
             join(rw::flux2_default_out_layers(o.variant)) + ") need " + std::to_string(needed) +
             " text encoder layers; generate with three hidden-state indices of at most " + std::to_string(layers) +
             ", e.g. --text-encoder-out-layers " + join(example) + "\n";
    }
    return rw::write_flux2_random_folder(s.dir, o, flux2_tokenizers(bundled, o.variant), progress);
  } else if (const auto flux = rw::parse_flux1_variant(s.like)) {
    rw::Flux1RandomOptions o;
    o.variant = *flux;
    if (s.blocks) std::tie(o.num_layers, o.num_single_layers) = parse_blocks(*s.blocks);
    o.t5_layers = s.t5_layers.value_or(o.t5_layers);
    o.dtype = s.dtype;
    o.layout_only = s.layout_only;
    o.seed = s.seed;
    *what = std::to_string(o.num_layers) + "+" + std::to_string(o.num_single_layers) + " transformer blocks, " +
           std::to_string(o.t5_layers) + " T5 layers";
    return rw::write_flux1_random_folder(s.dir, o, bundled, progress);
  } else {
    rw::Sd3RandomOptions o;
    o.variant = *rw::parse_sd3_variant(s.like);
    if (s.blocks) o.num_layers = parse_sd3_blocks(*s.blocks, s.like);
    o.t5_layers = s.t5_layers.value_or(o.t5_layers);
    o.dtype = s.dtype;
    o.layout_only = s.layout_only;
    o.seed = s.seed;
    *what = std::to_string(o.num_layers) + " transformer blocks";
    if (o.variant == rw::Sd3Variant::sd35_medium)
      *what += " (" + std::to_string(rw::sd3_dual_attention_layers(o.variant, o.num_layers).size()) +
              " with dual attention)";
    *what += ", " + std::to_string(o.t5_layers) + " T5 layers";
    return rw::write_sd3_random_folder(s.dir, o, bundled, progress);
  }
}

int make_random(const std::vector<std::string>& args) {
  std::optional<std::string> dir, like, blocks;
  std::optional<int64_t> t5_layers, text_encoder_layers;
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
    } else if (flag == "--blocks") {
      blocks = value();  // read once --like is known: D+S for FLUX.1 and FLUX.2, N for SD3
    } else if (flag == "--t5-layers") {
      t5_layers = parse_int(flag, value());
      KILN_CHECK(*t5_layers >= 1, "cli", "--t5-layers must be at least 1 (block 0 holds T5's position bias), got ",
                 *t5_layers);
      KILN_CHECK(*t5_layers <= rw::kMaxRandomLayers, "cli", "--t5-layers must be at most ", rw::kMaxRandomLayers,
                 " (T5-XXL has 24), got ", *t5_layers);
    } else if (flag == "--text-encoder-layers") {
      text_encoder_layers = parse_int(flag, value());
      KILN_CHECK(*text_encoder_layers >= 1, "cli", "--text-encoder-layers must be at least 1, got ",
                 *text_encoder_layers);
      KILN_CHECK(*text_encoder_layers <= rw::kMaxRandomLayers, "cli", "--text-encoder-layers must be at most ",
                 rw::kMaxRandomLayers, " (FLUX.2-dev's has 40), got ", *text_encoder_layers);
    } else if (flag == "--dtype") {
      dtype = parse_weights_dtype(value());
    } else if (flag == "--layout-only") {
      layout_only = true;
    } else if (flag == "--seed") {
      const int64_t s = parse_int(flag, value());
      KILN_CHECK(s >= 0, "cli", "--seed must be >= 0, got ", s);
      seed = uint64_t(s);
    } else {
      fail("cli", "unknown flag '", flag, "' for make-random (see kiln make-random --help)");
    }
  }
  KILN_CHECK(dir, "cli",
             "make-random needs the folder to write, e.g. kiln make-random /tmp/flux1 --like flux1-schnell");
  KILN_CHECK(like, "cli", "make-random needs --like NAME: ", rw::like_names_by_family());
  const std::optional<rw::Flux2Variant> flux2 = rw::parse_flux2_variant(*like);
  KILN_CHECK(!flux2 || !t5_layers, "cli", "--t5-layers: ", *like,
             " has no T5 encoder (its text encoder's depth is --text-encoder-layers)");
  KILN_CHECK(flux2 || !text_encoder_layers, "cli", "--text-encoder-layers is for FLUX.2 (", *like,
             "'s T5 depth is --t5-layers)");

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
  RandomLike spec{*dir, *like, blocks, t5_layers, text_encoder_layers, dtype, seed, layout_only};
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
