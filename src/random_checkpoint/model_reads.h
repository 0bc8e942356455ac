// A random checkpoint's tensors as the model reads them: the model is built from its config over
// a source that records every tensor it asks for (name, shape, how it reads it) and hands back
// reserved pages (nn::ShapesOnlyLoad), so the state dict is never declared a second time. How
// each tensor's values are drawn follows from how it is read, with the scales that keep
// activations O(1): a linear or convolution weight mapping n inputs has standard deviation
// gain/sqrt(n); its bias 0.01; a norm is the identity (weight 1, bias 0); an embedding table and
// any other tensor unit scale; a BatchNorm's running mean 0 and variance 1. ReadRules says what a
// family changes in that.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "io/json_config.h"
#include "nn/weights.h"
#include "random_checkpoint/random_component.h"

namespace kiln::random_weights {

struct ReadRules {
  // Keys a model looks for before reading, to choose what to build (a VAE builds its encoder
  // when it finds encoder.conv_in.weight): Weights::has answers yes for these, no for any other
  // key not read yet.
  std::vector<std::string> present;
  // Gains of linear weights, by the layer's key suffix ("attn.to_out.0"): the last projection of
  // each residual branch is scaled by 1/sqrt(branches), so the stream stays O(1) at any depth.
  std::vector<std::pair<std::string, double>> gains;
  // Tensors drawn otherwise, by their key suffix ("pos_embed.pos_embed").
  std::vector<std::pair<std::string, Init>> inits;
  // Tensors the library's files hold that the model never reads (a BatchNorm's step count).
  std::vector<RandomTensor> unread;
};

// The model `build` makes over `weights` (at the state-dict root), read into tensors in the order
// it reads them, each once.
std::vector<RandomTensor> tensors_read(const std::function<void(const nn::Weights& weights)>& build,
                                       const ReadRules& rules);

// What `Model`, built from a config.json (read as `Config`; its errors name `source`), reads.
template <typename Model, typename Config>
std::vector<RandomTensor> tensors_read_by(const nlohmann::json& config, const ReadRules& rules,
                                          const std::string& source) {
  const auto build = [&](const nn::Weights& w) { Model(Config::from_json(io::JsonConfig(config, source)), w); };
  return tensors_read(build, rules);
}

// One residual-branch gain for every suffix: 1/sqrt(max(1, branches)).
std::vector<std::pair<std::string, double>> residual_gains(const std::vector<std::string>& suffixes,
                                                           int64_t branches);

}  // namespace kiln::random_weights
