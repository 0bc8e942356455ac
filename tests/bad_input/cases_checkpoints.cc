// Bad-input corpus: float weights stored as integers, safetensors byte layout, unused tensors, classes kiln lacks,
// KILN_* environment.
#include <algorithm>
#include <cctype>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "corpus.h"

namespace kiln::corpus {

namespace {




// The transformer checkpoint of a model copy.
fs::path transformer_file(const fs::path& model) {
  return model / "transformer" / "diffusion_pytorch_model.safetensors";
}

}  // namespace

void add_checkpoint_cases(Corpus& corpus) {
  // A float weight stored as I32 (same element size, so every offset stays valid).
  {
    const fs::path m =
        corpus.sparse_copy("checkpoints_i32_weight", {"transformer/diffusion_pytorch_model.safetensors"});
    auto [header, data] = Corpus::read_safetensors(transformer_file(m));
    header["x_embedder.weight"]["dtype"] = "I32";
    Corpus::rewrite_safetensors(transformer_file(m), header, data);
    corpus.add(expecting(1, "checkpoints/float-weight-stored-as-i32", corpus.generate(m),
                         {"[weights]", "transformer/diffusion_pytorch_model.safetensors", "tensor 'x_embedder.weight'",
                          "is stored as I32, expected a floating-point dtype"}));
  }

  // Byte layout: 8 bytes that belong to no tensor between the first two tensors (later offsets
  // shifted, so every tensor is still valid), and 8 bytes after the last one.
  {
    const fs::path m = corpus.sparse_copy("checkpoints_hole", {"transformer/diffusion_pytorch_model.safetensors"});
    auto [header, data] = Corpus::read_safetensors(transformer_file(m));
    size_t first_end = data.size();
    for (const auto& [name, entry] : header.items())
      if (name != "__metadata__" && entry["data_offsets"][0].get<size_t>() == 0)
        first_end = entry["data_offsets"][1].get<size_t>();
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") continue;
      nlohmann::json& offsets = it.value()["data_offsets"];
      if (offsets[0].get<size_t>() < first_end) continue;
      offsets = nlohmann::json::array({offsets[0].get<size_t>() + 8, offsets[1].get<size_t>() + 8});
    }
    data.insert(first_end, 8, '\0');
    Corpus::rewrite_safetensors(transformer_file(m), header, data);
    corpus.add(expecting(1, "checkpoints/safetensors-hole", corpus.generate(m),
                         {"[safetensors]", "transformer/diffusion_pytorch_model.safetensors",
                          "bytes [" + std::to_string(first_end) + "," + std::to_string(first_end + 8) +
                              ") of the data section belong to no tensor",
                          "forbids holes"}));
    corpus.add(expecting(1, "checkpoints/safetensors-hole-inspect", {"inspect", "--model", m.string()},
                         {"belong to no tensor", "forbids holes"}));
  }
  {
    const fs::path m = corpus.sparse_copy("checkpoints_trailing", {"transformer/diffusion_pytorch_model.safetensors"});
    auto [header, data] = Corpus::read_safetensors(transformer_file(m));
    const size_t end = data.size();
    Corpus::rewrite_safetensors(transformer_file(m), header, data + std::string(8, '\0'));
    corpus.add(expecting(1, "checkpoints/safetensors-trailing-bytes", corpus.generate(m),
                         {"[safetensors]", "transformer/diffusion_pytorch_model.safetensors",
                          "8 bytes after the last tensor (data section bytes [" + std::to_string(end) + "," +
                              std::to_string(end + 8) + "))",
                          "belong to no tensor", "forbids trailing bytes"}));
  }

  // A tensor the model does not use: a warning without --strict (the run succeeds, writing its
  // PNG outside the watched folders), an error with it.
  {
    const fs::path m =
        corpus.sparse_copy("checkpoints_unused_tensor", {"transformer/diffusion_pytorch_model.safetensors"});
    auto [header, data] = Corpus::read_safetensors(transformer_file(m));
    header["extra.weight"] = {{"dtype", "F32"},
                              {"shape", nlohmann::json::array({2})},
                              {"data_offsets", nlohmann::json::array({data.size(), data.size() + 8})}};
    Corpus::rewrite_safetensors(transformer_file(m), header, data + std::string(8, '\0'));
    const fs::path written = corpus.scratch() / "checkpoints_written";
    fs::create_directories(written);
    const std::string png = (written / "unused_tensor.png").string();
    corpus.add(expecting(0, "checkpoints/unused-tensor-warning", corpus.generate(m, {"--out", png}),
                         {"warning: transformer does not use these checkpoint tensors",
                          "transformer/diffusion_pytorch_model.safetensors: 'extra.weight' (1 tensor)", "wrote " + png},
                         {}, {"--strict refuses"}));
    corpus.add(expecting(
        1, "checkpoints/unused-tensor-strict", corpus.generate(m, {"--strict"}),
        {"[weights] transformer does not use these checkpoint tensors", "'extra.weight'", "--strict refuses them"}, {},
        {"wrote "}));
  }

  // Terminal escapes in what a checkpoint holds reach the terminal escaped (core/terminal.h), in
  // a warning and in an error alike: a tensor named with an ESC colour sequence and a newline
  // that would forge a "wrote" line, and a merges.txt line holding a title-setting OSC sequence.
  {
    const fs::path m =
        corpus.sparse_copy("checkpoints_escape_tensor", {"transformer/diffusion_pytorch_model.safetensors"});
    auto [header, data] = Corpus::read_safetensors(transformer_file(m));
    header["\x1b[31mred\nkiln: wrote forged.png"] = {
        {"dtype", "F32"},
        {"shape", nlohmann::json::array({2})},
        {"data_offsets", nlohmann::json::array({data.size(), data.size() + 8})}};
    Corpus::rewrite_safetensors(transformer_file(m), header, data + std::string(8, '\0'));
    const fs::path written = corpus.scratch() / "checkpoints_written";
    fs::create_directories(written);
    const std::string png = (written / "escape_tensor.png").string();
    const std::string shown = "'\\x1b[31mred\\x0akiln: wrote forged.png' (1 tensor)";
    corpus.add(expecting(0, "checkpoints/escape-sequence-in-tensor-name-warning", corpus.generate(m, {"--out", png}),
                         {"warning: transformer does not use these checkpoint tensors", shown, "wrote " + png}, {},
                         {"\x1b", "\nkiln: wrote forged.png"}));
    corpus.add(expecting(1, "checkpoints/escape-sequence-in-tensor-name-strict", corpus.generate(m, {"--strict"}),
                         {"[weights] transformer does not use these checkpoint tensors", shown},
                         {}, {"\x1b", "\nkiln: wrote forged.png", "kiln: wrote /"}));
  }
  {
    const fs::path m = corpus.sparse_copy("checkpoints_escape_merges", {"tokenizer/merges.txt"});
    std::ofstream(m / "tokenizer" / "merges.txt", std::ios::app) << "a b \x1b]0;pwned\x07\n";
    corpus.add(expecting(1, "checkpoints/escape-sequence-in-merges-line", corpus.generate(m),
                         {"[tokenizer]", "merges.txt: line", "is not a merge 'left right': 'a b \\x1b]0;pwned\\x07'"},
                         {}, {"\x1b", "\x07"}));
  }

  // model_index.json naming classes kiln's FluxPipeline does not implement.
  {
    const fs::path m = corpus.sparse_copy("checkpoints_vae_tiny", {});
    Corpus::edit_json(m / "model_index.json", [](nlohmann::json& j) { j["vae"] = {"diffusers", "AutoencoderTiny"}; });
    corpus.add(expecting(
        1, "checkpoints/class-autoencoder-tiny", corpus.generate(m),
        {"model_index.json", "component 'vae' is AutoencoderTiny", "does not implement", "expected AutoencoderKL"}));
  }
  {
    const fs::path m = corpus.sparse_copy("checkpoints_t5_conditional", {});
    Corpus::edit_json(m / "model_index.json", [](nlohmann::json& j) {
      j["text_encoder_2"] = {"transformers", "T5ForConditionalGeneration"};
    });
    corpus.add(expecting(1, "checkpoints/class-t5-for-conditional-generation", corpus.generate(m),
                         {"model_index.json", "component 'text_encoder_2' is T5ForConditionalGeneration",
                          "does not implement", "expected T5EncoderModel"}));
  }

  // text_encoder_2/config.json feed_forward_proj: an activation kiln lacks ("gated-foo"; the
  // fixture's explicit dense_act_fn / is_gated_act would override it, as in transformers, so
  // they are removed), and a value that is neither "X" nor "gated-X".
  {
    const fs::path m = corpus.sparse_copy("checkpoints_ffp_gated_foo", {});
    Corpus::edit_json(m / "text_encoder_2" / "config.json", [](nlohmann::json& j) {
      j["feed_forward_proj"] = "gated-foo";
      j.erase("dense_act_fn");
      j.erase("is_gated_act");
    });
    corpus.add(expecting(1, "checkpoints/t5-feed-forward-proj-gated-foo", corpus.generate(m),
                         {"[t5_encoder]", "text_encoder_2/config.json", "activation 'foo'",
                          "from feed_forward_proj 'gated-foo'", "is not supported"}));
  }
  {
    const fs::path m = corpus.sparse_copy("checkpoints_ffp_three_parts", {});
    Corpus::edit_json(m / "text_encoder_2" / "config.json",
                      [](nlohmann::json& j) { j["feed_forward_proj"] = "gelu-tanh-x"; });
    corpus.add(expecting(1, "checkpoints/t5-feed-forward-proj-gelu-tanh-x", corpus.generate(m),
                         {"[t5_encoder]", "text_encoder_2/config.json", "field 'feed_forward_proj' is 'gelu-tanh-x'",
                          "expected 'X' or 'gated-X'"}));
  }

  // KILN_* environment: a bad value is refused at start with the variable and what it expects.
  const std::pair<const char*, const char*> bad_env[] = {
      {"KILN_DEFER_AND_FUSE=yes", "expected 1 (on) or 0 (off)"},
      {"KILN_LAUNCH_BLOCKING=2", "expected 1 (on) or 0 (off)"},
      {"KILN_MAX_PENDING=abc", "expected a positive whole number"},
      {"KILN_MAX_PENDING=0", "expected a positive whole number"},
      {"KILN_GEMM=mkl", "expected one of 'onednn', 'openblas'"},
      {"KILN_DEFER_MAX_NODES=-5", "expected a positive whole number"},
      {"KILN_COLLECTIVE_TIMEOUT=soon", "expected a positive number"},
      {"KILN_DEFER_LOG=9", "expected one of '0', '1', '2'"},
  };
  for (const auto& [assignment, expected] : bad_env) {
    const std::string a = assignment;
    const size_t eq = a.find('=');
    const std::string var = a.substr(0, eq), value = a.substr(eq + 1);
    std::string what = var + "-" + value;
    std::transform(what.begin(), what.end(), what.begin(),
                   [](char ch) { return ch == '_' ? '-' : char(std::tolower(static_cast<unsigned char>(ch))); });
    corpus.add(expecting(1, "checkpoints/env-" + what, corpus.generate(corpus.tiny_model()),
                         {"[env] " + var + "='" + value + "'", expected}, {a}, {"wrote "}));
  }
  // An unknown KILN_* name (a typo): a warning, and the run goes on.
  {
    const fs::path written = corpus.scratch() / "checkpoints_written";
    fs::create_directories(written);
    const std::string png = (written / "unknown_env.png").string();
    corpus.add(expecting(0, "checkpoints/env-unknown-name", corpus.generate(corpus.tiny_model(), {"--out", png}),
                         {"warning: KILN_DEFER_AND_FUZE is not a kiln environment variable", "wrote " + png},
                         {"KILN_DEFER_AND_FUZE=1"}));
  }
}

}  // namespace kiln::corpus
