#include "nn/weights.h"

#include <map>

#include "core/error.h"
#include "exec/residency.h"

namespace kiln::nn {

Weights::Weights(const std::filesystem::path& checkpoint) : source_(open_checkpoint(checkpoint)) {}

Weights::Weights(std::shared_ptr<const WeightSource> source, std::string prefix)
    : source_(std::move(source)), prefix_(std::move(prefix)) {}

Weights Weights::sub(const std::string& name) const {
  Weights w(source_, prefix_ + name + ".");
  w.plan_ = plan_;
  w.dtype_ = dtype_;
  return w;
}

Weights Weights::with_dtype(std::optional<DType> dtype) const {
  KILN_CHECK(!dtype || is_floating(*dtype), "weights", "weights are held in a floating-point dtype, not ",
             dtype_name(*dtype));
  KILN_CHECK(dtype || source_ != nullptr, "weights", "dtype \"auto\" needs a checkpoint");
  Weights w = *this;
  w.dtype_ = dtype ? *dtype : stored_float_dtype(*source_);
  return w;
}

Weights Weights::with_plan(std::shared_ptr<const ShardPlan> plan) const {
  Weights w = *this;
  w.plan_ = std::move(plan);
  return w;
}

bool Weights::has(const std::string& name) const { return source_ && source_->contains(key(name)); }

std::string Weights::checked_key(const std::string& name, const Shape& shape) const {
  KILN_CHECK(source_ != nullptr, "weights", "no checkpoint loaded for '", key(name), "'");
  const std::string k = key(name);
  KILN_CHECK(source_->contains(k), "weights", describe(), ": tensor '", k,
             "' is missing (the model's config expects it with shape ", to_string(shape), ")");
  const Shape stored = source_->shape(k);
  KILN_CHECK(stored == shape, "weights", describe(), ": tensor '", k, "' has shape ", to_string(stored),
             " but the config implies ", to_string(shape));
  return k;
}

void Weights::collect_weight(const std::string& key, const Tensor& weight) {
  if (ComponentWeights* c = WeightCollector::active()) c->add(weight);  // model offload knows its weights
  ParameterRecorder::record(key, weight);
}

Tensor Weights::get(const std::string& name, const Shape& shape, DType dtype) const {
  const std::string k = checked_key(name, shape);
  Tensor t = source_->load(k, dtype);
  collect_weight(k, t);
  return t;
}

Tensor Weights::get_slice(const std::string& name, const Shape& shape, int dim, int64_t start, int64_t length,
                          bool collect) const {
  const std::string k = checked_key(name, shape);
  Tensor t = source_->load_slice(k, dim, start, length, dtype_);
  if (collect) collect_weight(k, t);
  return t;
}

namespace {
thread_local std::vector<ParameterRecorder*> t_recorders;
}  // namespace

std::vector<Tensor> parameter_values(const NamedParameters& named) {
  std::vector<Tensor> out;
  out.reserve(named.size());
  for (const auto& [key, t] : named) out.push_back(t);
  return out;
}

ParameterRecorder::ParameterRecorder() { t_recorders.push_back(this); }
ParameterRecorder::~ParameterRecorder() { t_recorders.pop_back(); }

void ParameterRecorder::record(const std::string& key, const Tensor& t) {
  for (ParameterRecorder* r : t_recorders) r->recorded_.emplace_back(key, t);
}

NamedParameters ParameterRecorder::named(const std::string& prefix) const {
  const std::string strip = prefix.empty() ? prefix : prefix + ".";
  std::map<std::string, Tensor> by_key;
  for (const auto& [key, t] : recorded_)
    by_key[key.compare(0, strip.size(), strip) == 0 ? key.substr(strip.size()) : key] = t;  // a key loaded twice: the last
  return NamedParameters(by_key.begin(), by_key.end());
}

}  // namespace kiln::nn
