// Host memory and time of one T5 prompt encoding (FLUX.1's text_encoder_2) in a chosen dtype:
// the weights held (read in place from the mapped checkpoint when stored in that dtype), the
// process's peak RSS, and the seconds of the load and of the encoding. Meant for full-size
// T5-XXL folders written by `kiln make-random` (9.5 GB of bf16 weights), which must encode in
// well under the machine's memory.
//
//   build/bench/bench_t5_encode DIR [bf16|f32] [TOKENS]     # DIR: a FLUX.1 pipeline folder
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "exec/host.h"
#include "exec/ops.h"
#include "exec/residency.h"
#include "io/safetensors.h"
#include "models/t5/t5_encoder.h"
#include "tokenizers/t5_tokenizer.h"

namespace {

double gib(double bytes) { return bytes / double(1u << 30); }

double peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) * 1024;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s PIPELINE_DIR [bf16|f32] [TOKENS]\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  const std::string dtype_arg = argc > 2 ? argv[2] : "bf16";
  const DType dtype = dtype_arg == "f32" ? DType::f32 : DType::bf16;
  const int64_t tokens = argc > 3 ? std::stoll(argv[3]) : 512;
  try {
    const auto t0 = std::chrono::steady_clock::now();
    ComponentWeights weights("text_encoder_2");
    T5EncoderModel model = [&] {
      WeightCollector collect(weights);
      return T5EncoderModel::from_pretrained(dir / "text_encoder_2", dtype);
    }();
    const auto tokenizer = tokenizers::T5Tokenizer::from_pretrained(dir / "tokenizer_2");
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto ids = tokenizer.encode_padded("a red fox in the snow, photographed at dawn", tokens);
    const auto t1 = std::chrono::steady_clock::now();
    const Tensor out = model.forward(from_ints(ids, {1, int64_t(ids.size())})).last_hidden_state;
    const std::vector<float> v = to_vector(cast(out, DType::f32));
    const double encode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    bool finite = true;
    for (float x : v) finite = finite && std::isfinite(x);
    const ComponentWeights::Bytes b = weights.bytes_by();
    std::printf("T5 %s: %lld layers, d_model %lld, %lld tokens\n", dtype_name(dtype),
                static_cast<long long>(model.config().num_layers), static_cast<long long>(model.config().d_model),
                static_cast<long long>(tokens));
    std::printf("weights held: %.2f GiB (", gib(double(weights.bytes())));
    for (const auto& [place, n] : b.by_place) std::printf(" %s %.2f GiB", place.c_str(), gib(double(n)));
    std::printf(" )\nload %.2f s, encode %.2f s, output %s\n", load_s, encode_s, finite ? "finite" : "NOT FINITE");
    std::printf("peak RSS %.2f GiB (weights + %.2f GiB), bytes read %.2f GiB\n", gib(peak_rss_bytes()),
                gib(peak_rss_bytes() - double(weights.bytes())), gib(double(io::bytes_read())));
    return finite ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_t5_encode: %s\n", e.what());
    return 1;
  }
}
