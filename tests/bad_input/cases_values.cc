// Bad-input corpus: NaN/Inf weights, latents and scalars; config values out of range.
//
// No silent black image: a NaN/Inf weight is caught after the stage it poisons (text encoders,
// a transformer step, the VAE decode), which is named with the likely tensor; NaN/Inf initial
// latents or --guidance are refused before any work; config values that would divide by zero
// or make the sigma schedule meaningless are refused with the file and the field.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "corpus.h"

namespace kiln::corpus {

namespace {



constexpr unsigned char kNaN[4] = {0x00, 0x00, 0xc0, 0x7f};  // F32 little-endian quiet NaN
constexpr unsigned char kInf[4] = {0x00, 0x00, 0x80, 0x7f};  // F32 little-endian +Inf

// Overwrites the first element of F32 tensor `tensor` in `file` with `value` (4 bytes).
void poison(const fs::path& file, const std::string& tensor, const unsigned char (&value)[4]) {
  auto [header, data] = Corpus::read_safetensors(file);
  const size_t begin = header.at(tensor).at("data_offsets").at(0).get<size_t>();
  std::memcpy(data.data() + begin, value, sizeof value);
  Corpus::rewrite_safetensors(file, header, data);
}

// A safetensors file holding one F32 tensor `name` of `shape`, every value 0.5 but the fourth,
// which is `bad` when given.
void write_latents(const fs::path& file, const std::string& name, const std::vector<int64_t>& shape,
                   const unsigned char* bad = nullptr) {
  size_t count = 1;
  for (const int64_t d : shape) count *= size_t(d);
  std::string data(count * 4, '\0');
  const float half = 0.5f;
  for (size_t i = 0; i < count; ++i) std::memcpy(data.data() + 4 * i, &half, 4);
  if (bad) std::memcpy(data.data() + 12, bad, 4);
  nlohmann::json header;
  header[name] = {
      {"dtype", "F32"}, {"shape", shape}, {"data_offsets", nlohmann::json::array({size_t(0), data.size()})}};
  Corpus::write_safetensors(file, header, data);
}

// A case failing with the message's key words, before any image is written.
Case fails(std::string name, std::vector<std::string> args, std::vector<std::string> expect) {
  return failing(std::move(name), std::move(args), std::move(expect), {}, {"wrote "});
}

}  // namespace

void add_value_cases(Corpus& corpus) {
  // NaN/Inf weights, one component each: the stage that produced non-finite values and the tensor.
  {
    const fs::path m =
        corpus.sparse_copy("values_nan_transformer", {"transformer/diffusion_pytorch_model.safetensors"});
    poison(m / "transformer" / "diffusion_pytorch_model.safetensors", "x_embedder.weight", kNaN);
    corpus.add(fails("values/nan-transformer-weight", corpus.generate(m),
                     {"[pipeline] transformer step 1/1 produced NaN/Inf", "tensor 'x_embedder.weight'",
                      "transformer/diffusion_pytorch_model.safetensors"}));
  }
  {
    const fs::path m = corpus.sparse_copy("values_inf_vae", {"vae/diffusion_pytorch_model.safetensors"});
    poison(m / "vae" / "diffusion_pytorch_model.safetensors", "decoder.conv_in.weight", kInf);
    corpus.add(fails("values/inf-vae-decoder-weight", corpus.generate(m),
                     {"[pipeline] VAE decode produced NaN/Inf", "tensor 'decoder.conv_in.weight'",
                      "vae/diffusion_pytorch_model.safetensors"}));
  }
  {
    const fs::path m = corpus.sparse_copy("values_nan_clip", {"text_encoder/model.safetensors"});
    poison(m / "text_encoder" / "model.safetensors", "text_model.embeddings.position_embedding.weight", kNaN);
    corpus.add(fails("values/nan-clip-weight", corpus.generate(m),
                     {"text encoder (CLIP, text_encoder) produced NaN/Inf",
                      "tensor 'text_model.embeddings.position_embedding.weight'", "text_encoder/model.safetensors"}));
  }
  {
    const fs::path m = corpus.sparse_copy("values_nan_t5", {"text_encoder_2/model.safetensors"});
    poison(m / "text_encoder_2" / "model.safetensors", "encoder.block.0.layer.0.SelfAttention.q.weight", kNaN);
    corpus.add(fails("values/nan-t5-weight", corpus.generate(m),
                     {"text encoder (T5, text_encoder_2) produced NaN/Inf",
                      "tensor 'encoder.block.0.layer.0.SelfAttention.q.weight'", "text_encoder_2/model.safetensors"}));
  }

  // Initial latents (--latents): non-finite values, unpacked [1, C, H, W] or packed [1, L, 4C];
  // the tiny model has in_channels 4, so C = 1 and at 32x32 L = 256.
  {
    const fs::path dir = corpus.scratch() / "values_latents";
    fs::create_directories(dir);
    const fs::path nan_file = dir / "nan.safetensors", inf_file = dir / "packed_inf.safetensors",
                   wrong = dir / "wrong_shape.safetensors";
    write_latents(nan_file, "latents", {1, 1, 32, 32}, kNaN);
    write_latents(inf_file, "latents", {1, 256, 4}, kInf);
    write_latents(wrong, "latents", {1, 4, 32, 32});
    const std::string finite = "initial latents hold NaN or Inf values; every value must be a finite number";
    corpus.add(fails("values/latents-nan", corpus.generate(corpus.tiny_model(), {"--latents", nan_file.string()}),
                     {"[pipeline] " + finite}));
    corpus.add(fails("values/latents-packed-inf",
                     corpus.generate(corpus.tiny_model(), {"--latents", inf_file.string()}), {finite}));
    corpus.add(fails(
        "values/latents-wrong-shape", corpus.generate(corpus.tiny_model(), {"--latents", wrong.string()}),
        {"initial latents have shape [1,4,32,32]", "expected packed [1,256,4] or unpacked [1,1,32,32]", "for 32x32"}));
  }

  // --guidance: a non-finite scale is refused by the CLI (the call argument table's bounds).
  for (const char* g : {"nan", "inf", "-inf"})
    corpus.add(fails(std::string("values/guidance-") + g, corpus.generate(corpus.tiny_model(), {"--guidance", g}),
                     {"[cli] flag --guidance expects a number in [0, 100]", std::string("got '") + g + "'"}));

  // vae/config.json: scaling_factor 0 (the latents are divided by it).
  {
    const fs::path m = corpus.sparse_copy("values_vae_scaling_zero", {});
    Corpus::edit_json(m / "vae" / "config.json", [](nlohmann::json& j) { j["scaling_factor"] = 0; });
    corpus.add(fails("values/vae-scaling-factor-zero", corpus.generate(m),
                     {"[vae]", "vae/config.json", "field 'scaling_factor' is 0", "expected a finite non-zero number"}));
  }

  // scheduler/scheduler_config.json: values the sigma schedule cannot use.
  const auto scheduler_case = [&](const std::string& what, const std::function<void(nlohmann::json&)>& edit,
                                  std::vector<std::string> expect) {
    const fs::path m = corpus.sparse_copy("values_scheduler_" + what, {});
    Corpus::edit_json(m / "scheduler" / "scheduler_config.json", edit);
    expect.insert(expect.begin(), {"[scheduler]", "scheduler/scheduler_config.json"});
    corpus.add(fails("values/scheduler-" + what, corpus.generate(m), std::move(expect)));
  };
  scheduler_case("shift-zero", [](nlohmann::json& j) { j["shift"] = 0; },
                 {"field 'shift' is 0", "expected a positive number"});
  scheduler_case("shift-negative", [](nlohmann::json& j) { j["shift"] = -1; },
                 {"field 'shift' is -1", "expected a positive number"});
  scheduler_case("num-train-timesteps-zero", [](nlohmann::json& j) { j["num_train_timesteps"] = 0; },
                 {"field 'num_train_timesteps' is 0", "expected at least 1"});
  scheduler_case("dynamic-shift-equal-seq-lens",
                 [](nlohmann::json& j) {
                   j["use_dynamic_shifting"] = true;
                   j["base_image_seq_len"] = j["max_image_seq_len"];
                 },
                 {"'base_image_seq_len' (4096)", "'max_image_seq_len' (4096)", "must satisfy 1 <= base < max"});
}

}  // namespace kiln::corpus
