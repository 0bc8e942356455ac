// `kiln make-random DIR --like flux1-schnell|flux1-dev`: a real-size FLUX.1 folder with
// deterministic random weights, for speed and memory measurements without the download. The
// work is models/random/flux1_random_folder.h; this file reads the flags and prints the summary.
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "commands.h"
#include "core/error.h"
#include "models/random/flux1_random_folder.h"

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
    return int64_t(std::stoll(s));
  };
  KILN_CHECK(plus != std::string::npos, "cli", "--blocks ", v,
             ": expected D+S, the double-stream and single-stream block counts (e.g. 19+38)");
  return {part(v.substr(0, plus)), part(v.substr(plus + 1))};
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

int make_random(const std::vector<std::string>& args) {
  rw::Flux1RandomOptions o;
  std::optional<std::string> dir;
  bool like_given = false;
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
      const auto variant = rw::parse_flux1_variant(v);
      KILN_CHECK(variant, "cli", "--like ", v, ": expected flux1-schnell or flux1-dev");
      o.variant = *variant;
      like_given = true;
    } else if (flag == "--blocks") {
      std::tie(o.num_layers, o.num_single_layers) = parse_blocks(value());
    } else if (flag == "--t5-layers") {
      o.t5_layers = parse_int(flag, value());
      KILN_CHECK(o.t5_layers >= 1, "cli", "--t5-layers must be at least 1 (block 0 holds T5's position bias), got ",
                 o.t5_layers);
    } else if (flag == "--dtype") {
      o.dtype = parse_weights_dtype(value());
    } else if (flag == "--seed") {
      const int64_t seed = parse_int(flag, value());
      KILN_CHECK(seed >= 0, "cli", "--seed must be >= 0, got ", seed);
      o.seed = uint64_t(seed);
    } else {
      fail("cli", "unknown flag '", flag, "' for make-random (see kiln make-random --help)");
    }
  }
  KILN_CHECK(dir, "cli",
             "make-random needs the folder to write, e.g. kiln make-random /tmp/flux1 --like flux1-schnell");
  KILN_CHECK(like_given, "cli", "make-random needs --like flux1-schnell or --like flux1-dev");

  const auto t0 = std::chrono::steady_clock::now();
  rw::Flux1RandomProgress progress;
  bool started = false;
  progress.starting = [&](const rw::WrittenComponent&) {  // the folder passed every check
    if (std::exchange(started, true)) return;
    std::printf(
        "kiln: writing a random %s folder (%lld+%lld transformer blocks, %lld T5 layers, %s, seed %llu) to %s\n",
        rw::flux1_variant_name(o.variant), static_cast<long long>(o.num_layers),
        static_cast<long long>(o.num_single_layers), static_cast<long long>(o.t5_layers), dtype_name(o.dtype),
        static_cast<unsigned long long>(o.seed), dir->c_str());
    std::fflush(stdout);
  };
  progress.written = print_component;
  const rw::Flux1RandomFolder folder =
      rw::write_flux1_random_folder(*dir, o, std::filesystem::path(KILN_BUNDLED_MODEL), progress);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t tensors = 0;
  for (const rw::WrittenComponent& c : folder.components) tensors += c.tensors;
  std::printf("  %-15s %14s %27s %17s bytes (%s)  configs, scheduler, tokenizers\n", "other", "", "",
              grouped(folder.other_bytes).c_str(), gib(folder.other_bytes).c_str());
  std::printf("kiln: wrote %s: %lld tensors, %s parameters, %s bytes (%s) in %.1f s\n", dir->c_str(),
              static_cast<long long>(tensors), grouped(uint64_t(folder.total_parameters())).c_str(),
              grouped(folder.total_bytes()).c_str(), gib(folder.total_bytes()).c_str(), seconds);
  return 0;
}

}  // namespace kiln::cli
