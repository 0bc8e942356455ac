#include "random_checkpoint/model_reads.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "nn/shapes_only_load.h"

namespace kiln::random_weights {

namespace {

struct Read {
  std::string key;
  Shape shape;
  nn::WeightUse use;
};

// Becomes what the model reads: every key it expects exists with the expected shape, as
// reserved pages (nothing is committed, however large the model).
class RecordingSource : public nn::WeightSource {
 public:
  explicit RecordingSource(const std::vector<std::string>& present) : present_(present) {}
  std::string describe() const override { return "(random checkpoint)"; }
  void expect(const std::string& key, const Shape& shape, nn::WeightUse use) const override {
    if (index_.emplace(key, reads_.size()).second) reads_.push_back({key, shape, use});
  }
  bool contains(const std::string& key) const override {
    return index_.count(key) || std::find(present_.begin(), present_.end(), key) != present_.end();
  }
  Shape shape(const std::string& key) const override {
    const auto it = index_.find(key);
    KILN_CHECK(it != index_.end(), "make-random", "the model asked for the shape of '", key,
               "' before reading it; read it through Weights::get");
    return reads_[it->second].shape;
  }
  Tensor load(const std::string& key, DType dtype) const override {
    return nn::ShapesOnlyLoad::weight(shape(key), dtype);
  }
  Tensor load_slice(const std::string& key, int dim, int64_t, int64_t length, DType dtype) const override {
    Shape s = shape(key);
    s[size_t(dim)] = length;
    return nn::ShapesOnlyLoad::weight(s, dtype);
  }
  const std::vector<Read>& reads() const { return reads_; }

 private:
  const std::vector<std::string>& present_;
  mutable std::map<std::string, size_t> index_;
  mutable std::vector<Read> reads_;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// `path` is `name` or ends with "." + name.
bool names(const std::string& path, const std::string& name) {
  return path == name || ends_with(path, "." + name);
}

std::string layer_of(const std::string& key) { return key.substr(0, key.rfind('.')); }

Init init_of(const Read& r, const ReadRules& rules, const std::map<std::string, const Read*>& by_key) {
  for (const auto& [name, init] : rules.inits)
    if (names(r.key, name)) return init;
  const std::string layer = layer_of(r.key);
  double gain = 1;
  for (const auto& [name, g] : rules.gains)
    if (ends_with(layer, "." + name)) gain = g;  // inside a block, never the model's own output layer
  const size_t rank = r.shape.size();
  if (ends_with(r.key, ".running_mean")) return Init::constant(0);
  if (ends_with(r.key, ".running_var")) return Init::constant(1);
  if (ends_with(r.key, ".bias")) {  // a norm's is 0; a linear or convolution layer's small
    const auto w = by_key.find(layer + ".weight");
    const bool norm = w != by_key.end() && w->second->shape.size() == 1;
    return norm ? Init::constant(0) : Init::uniform(kBiasStd);
  }
  if (r.use == nn::WeightUse::linear_weight) return Init::uniform(gain / std::sqrt(double(r.shape[1])));
  if (rank == 4) return Init::uniform(gain / std::sqrt(double(r.shape[1] * r.shape[2] * r.shape[3])));
  if (rank == 1 && ends_with(r.key, ".weight")) return Init::constant(1);  // a norm's scale
  return Init::uniform(1.0);  // embedding tables
}

}  // namespace

std::vector<RandomTensor> tensors_read(const std::function<void(const nn::Weights&)>& build, const ReadRules& rules) {
  auto source = std::make_shared<RecordingSource>(rules.present);
  {
    nn::ShapesOnlyLoad shapes_only;
    build(nn::Weights(source).with_dtype(DType::bf16));
  }
  std::map<std::string, const Read*> by_key;
  for (const Read& r : source->reads()) by_key[r.key] = &r;
  std::vector<RandomTensor> out;
  for (const Read& r : source->reads()) out.push_back({r.key, r.shape, init_of(r, rules, by_key), std::nullopt});
  out.insert(out.end(), rules.unread.begin(), rules.unread.end());
  return out;
}

std::vector<std::pair<std::string, double>> residual_gains(const std::vector<std::string>& suffixes,
                                                           int64_t branches) {
  const double gain = 1 / std::sqrt(double(std::max<int64_t>(1, branches)));
  std::vector<std::pair<std::string, double>> out;
  for (const std::string& s : suffixes) out.emplace_back(s, gain);
  return out;
}

}  // namespace kiln::random_weights
