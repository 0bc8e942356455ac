// Real checkpoints in real memory: a bf16 FLUX.1-schnell folder at the real widths (kiln
// make-random, 2 double + 4 single blocks, one T5 layer: 3.2 GB of weights) runs through the CLI
// with its weights held as stored — memory.weights_bytes equal to the files' tensor bytes, all
// bf16, no f32 copy of any weight — and a host peak RSS within 15 % of those weights plus what
// the call's memory estimate says it needs; the same under model offload and, per rank, under
// tensor parallelism over two MPI processes (each rank holding about half the transformer).
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "devices/cpu/allocator.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::string run(const std::string& command) {
  std::string out;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf{};
  while (p && std::fgets(buf.data(), int(buf.size()), p)) out += buf.data();
  const int status = p ? ::pclose(p) : -1;
  EXPECT_EQ(status, 0) << command << "\n" << out;
  return out;
}

nlohmann::json read_json(const fs::path& file) {
  std::ifstream in(file);
  return nlohmann::json::parse(in);
}

// Bytes of every tensor in a component folder's safetensors files.
size_t tensor_bytes(const fs::path& folder) {
  size_t n = 0;
  for (const auto& entry : fs::directory_iterator(folder)) {
    if (entry.path().extension() != ".safetensors") continue;
    const io::SafetensorsFile f(entry.path());
    for (const std::string& name : f.names()) n += f.info(name).nbytes();
  }
  return n;
}

// One real-size folder for the suite (written once: it takes seconds on a RAM disk).
class RealSizeMemory : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // A RAM disk when there is room (writes in seconds), else the temp folder.
    const fs::path base = fs::space("/dev/shm").available > (size_t(8) << 30) ? fs::path("/dev/shm")
                                                                                 : fs::temp_directory_path();
    dir_ = base / ("kiln_real_size_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    run(std::string(KILN_CLI_PATH) + " make-random " + (dir_ / "schnell").string() +
        " --like flux1-schnell --blocks 2+4 --t5-layers 1 --dtype bf16");
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static fs::path dir_;
};
fs::path RealSizeMemory::dir_;

TEST_F(RealSizeMemory, Bf16FolderHoldsItsFileBytesInPlaceUnderOffloadAndTensorParallel) {
  const fs::path dir = dir_;
  const fs::path model = dir / "schnell", report = dir / "run.json", png = dir / "out.png";
  const std::string cli = KILN_CLI_PATH;
  const char* components[] = {"text_encoder", "text_encoder_2", "transformer", "vae"};
  std::map<std::string, size_t> file_bytes;
  size_t files_total = 0;
  for (const char* c : components) files_total += file_bytes[c] = tensor_bytes(model / c);
  ASSERT_GT(file_bytes["transformer"], size_t(2) << 30);  // the real widths: 2.6 GB for 2+4 blocks

  const std::string call = " generate --model " + model.string() +
                           " --prompt 'a red fox in the snow' --height 256 --width 256 --steps 1 --guidance 0"
                           " --max-sequence-length 64 --out " + png.string() + " --report " + report.string();
  const auto check = [&](const std::string& what, const nlohmann::json& r) {
    const nlohmann::json& w = r["memory"]["weights_bytes"];
    for (const char* c : components) EXPECT_EQ(r["engine"]["dtype"][c], "bf16") << what << " " << c;
    // No f32 (or any other) copy of a weight: every byte held is bf16.
    EXPECT_EQ(w["by_dtype"].size(), 1u) << what << ": " << w["by_dtype"].dump();
    EXPECT_EQ(w["by_dtype"]["bf16"], w["total"]) << what;
    const double rss = r["memory"]["host_peak_rss_bytes"].get<double>();
    const double need = w["total"].get<double>() + r["memory"]["estimate"]["required_bytes"].get<double>();
    std::printf("%s: weights %.3f GB (files %.3f GB), estimate %.3f GB, peak RSS %.3f GB = %.3f x (weights + "
                "estimate)\n",
                what.c_str(), w["total"].get<double>() / 1e9, double(files_total) / 1e9,
                r["memory"]["estimate"]["required_bytes"].get<double>() / 1e9, rss / 1e9, rss / need);
    EXPECT_LE(rss, 1.15 * need) << what;
    return w;
  };

  // Weights read in place: exactly the files' tensor bytes, all of them from the mapping.
  run(cli + call);
  nlohmann::json w = check("in place", read_json(report));
  EXPECT_NEAR(w["total"].get<double>(), double(files_total), 0.01 * double(files_total));
  EXPECT_EQ(w["by_place"]["mapped_file"], w["total"]);

  // Model offload: one component at a time on the device (its copy counted by the estimate), all
  // back on the host, in place, at the end of the call.
  run(cli + call + " --offload model");
  const nlohmann::json offloaded = read_json(report);
  w = check("model offload", offloaded);
  EXPECT_NEAR(w["total"].get<double>(), double(files_total), 0.01 * double(files_total));
  EXPECT_EQ(w["by_place"]["mapped_file"], w["total"]);
  // The checkpoint pages a device copy was made from leave the resident set as it is made, so
  // the process holds about one component at a time: its device copy and activations (the
  // plan's required bytes), not the other components' mapped weights beside it.
  const double required = offloaded["memory"]["estimate"]["required_bytes"].get<double>();
  const double offload_rss = offloaded["memory"]["host_peak_rss_bytes"].get<double>();
  std::printf("model offload: peak RSS %.3f GB, the plan's largest component + activations %.3f GB, all weights "
              "%.3f GB\n", offload_rss / 1e9, required / 1e9, double(files_total) / 1e9);
  EXPECT_LE(offload_rss, 1.15 * required + 0.25e9);
  EXPECT_LT(offload_rss, 0.9 * double(files_total));

  // Two ranks: each reads and holds its half of the transformer (plus the replicated rest).
  run(std::string(KILN_MPIRUN_COMMAND) + " " + cli + call + " --tp 2");
  const nlohmann::json r = read_json(report);
  w = check("tensor parallel, rank 0", r);
  const double transformer = w["components"]["transformer"]["total"].get<double>();
  std::printf("tensor parallel: rank 0 holds %.3f of the transformer's %.3f GB\n", transformer / 1e9,
              double(file_bytes["transformer"]) / 1e9);
  EXPECT_GT(transformer, 0.45 * double(file_bytes["transformer"]));
  EXPECT_LT(transformer, 0.55 * double(file_bytes["transformer"]));
  for (const nlohmann::json& rank : r["tensor_parallel"]["ranks"]) {
    const double rss = rank["host_peak_rss_bytes"].get<double>();
    const double need = w["total"].get<double>() + r["memory"]["estimate"]["required_bytes"].get<double>();
    EXPECT_LE(rss, 1.15 * need) << "rank " << rank["rank"];
  }
}

// A tiled decode runs tiles of several shapes (here 3x3 tiles of 16 and 8 latent pixels a side),
// each asking for its own block sizes. The device allocator keeps what it frees for reuse, but
// within its bound of its in-use peak (cpu::Allocator::pool_bound), so the process holds what the
// call's plan says: the weights plus the planned activations, within 15 % either way
// (memory.estimate.host_peak_bytes).
TEST_F(RealSizeMemory, TiledDecodeHoldsWhatThePlanPredicts) {
  const fs::path model = dir_ / "schnell", report = dir_ / "tiled.json", png = dir_ / "tiled.png";
  run(std::string(KILN_CLI_PATH) + " generate --model " + model.string() +
      " --prompt 'a red fox in the snow' --height 256 --width 256 --steps 1 --guidance 0"
      " --max-sequence-length 64 --vae-tiling on --vae-tile-size 128 --out " +
      png.string() + " --report " + report.string());
  const nlohmann::json r = read_json(report);
  const nlohmann::json& m = r["memory"];
  EXPECT_EQ(r["timings"]["decode_vae_tile_size"], 128);
  EXPECT_EQ(m["estimate"]["vae_tile_size"], 128);
  // What the allocator held (in use + pooled) stayed within its bound of what it had in use.
  EXPECT_GT(m["device_peak_bytes"].get<double>(), 0);
  EXPECT_LE(m["device_reserved_peak_bytes"].get<double>(),
            double(cpu::Allocator::pool_bound(m["device_peak_bytes"].get<size_t>())));
  const double rss = m["host_peak_rss_bytes"].get<double>();
  const double plan = m["estimate"]["host_peak_bytes"].get<double>();
  EXPECT_DOUBLE_EQ(plan, m["weights_bytes"]["total"].get<double>() + m["estimate"]["required_bytes"].get<double>());
  std::printf("tiled decode: plan %.3f GB, peak RSS %.3f GB (%.3f x), device peak %.3f GB, reserved %.3f GB\n",
              plan / 1e9, rss / 1e9, rss / plan, m["device_peak_bytes"].get<double>() / 1e9,
              m["device_reserved_peak_bytes"].get<double>() / 1e9);
  EXPECT_LE(rss, 1.15 * plan);
  EXPECT_GE(rss, 0.85 * plan);
}

// A newcomer's real-width run on a terminal (a pseudo-terminal through script(1)) is never silent
// for long: every phase that took over a second by the run's own report has printed its line —
// each component's load (quantizing at load here), each onload, the encoders, every step and the
// decode.
TEST_F(RealSizeMemory, EveryPhaseOverASecondPrintsProgressOnATerminal) {
  const fs::path model = dir_ / "schnell", report = dir_ / "progress.json", png = dir_ / "progress.png";
  const std::string out = run("script -qec \"" + std::string(KILN_CLI_PATH) + " generate --model " + model.string() +
                              " --prompt 'a red fox in the snow' --height 256 --width 256 --steps 2 --guidance 0"
                              " --max-sequence-length 64 --offload model --quantize q8_0 --out " + png.string() +
                              " --report " + report.string() + "\" /dev/null");
  const nlohmann::json r = read_json(report);
  const auto has = [&](const std::string& line) { return out.find(line) != std::string::npos; };
  for (const char* c : {"text_encoder", "text_encoder_2", "transformer", "vae"})
    EXPECT_TRUE(has(std::string("kiln: loaded ") + c + " in ")) << c << "\n" << out;
  EXPECT_TRUE(has("kiln: loading transformer (quantizing to q8_0)")) << out;
  int onloads = 0;
  for (const nlohmann::json& e : r["offload"]["events"]) {
    if (e["action"] != "onload") continue;
    ++onloads;
    if (e["seconds"].get<double>() > 1) {
      EXPECT_TRUE(has("kiln: onloaded " + e["component"].get<std::string>() + " in ")) << e << "\n" << out;
    }
  }
  EXPECT_EQ(onloads, 4);
  if (r["timings"]["encode"].get<double>() > 1) {
    EXPECT_TRUE(has("kiln: encoding with text_encoder\r")) << out;
    EXPECT_TRUE(has("kiln: encoding with text_encoder_2")) << out;
  }
  EXPECT_TRUE(has("] step 1/2 ")) << out;  // the updating step line, with s/step and ETA
  EXPECT_TRUE(has("] step 2/2 ")) << out;
  EXPECT_TRUE(has(" s/step  ETA ")) << out;
  if (r["timings"]["decode"].get<double>() > 1) {
    EXPECT_TRUE(has("kiln: decoding with vae")) << out;
  }
  std::printf("phases: load %.1f s, encode %.1f s, steps %zu, decode %.1f s\n", r["timings"]["load"].get<double>(),
              r["timings"]["encode"].get<double>(), r["timings"]["steps"].size(), r["timings"]["decode"].get<double>());
}

}  // namespace
}  // namespace kiln
