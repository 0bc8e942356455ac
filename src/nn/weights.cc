#include "nn/weights.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/error.h"
#include "exec/host.h"
#include "exec/residency.h"
#include "nn/component_load.h"
#include "nn/shapes_only_load.h"
#include "nn/weight_quantization.h"

namespace kiln::nn {

Weights::Weights(const std::filesystem::path& checkpoint) {
  const ComponentLoad* load = ComponentLoad::active();
  source_ = load && load->replacement() ? load->replacement() : open_checkpoint(checkpoint);
  if (load) quantize_ = load->quantization();
}

Weights::Weights(std::shared_ptr<const WeightSource> source, std::string prefix)
    : source_(std::move(source)), prefix_(std::move(prefix)) {}

Weights Weights::sub(const std::string& name) const {
  Weights w(source_, prefix_ + name + ".");
  w.plan_ = plan_;
  w.dtype_ = dtype_;
  w.quantize_ = quantize_;
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

Weights Weights::with_quantization(std::optional<DType> type) const {
  KILN_CHECK(!type || is_storage_only(*type), "weights", "weights are quantized into fp8 or a ggml block type, not ",
             dtype_name(*type));
  Weights w = *this;
  w.quantize_ = type;
  return w;
}

DType Weights::linear_load_dtype(const std::string& key) const {
  const std::optional<DType> stored = source_->stored_dtype(key);
  return stored && is_storage_only(*stored) ? *stored : dtype_;
}

// Rows per panel when quantizing at load: ~16 MiB of f32 at a time.
constexpr int64_t kQuantizePanelBytes = int64_t(16) << 20;

Tensor Weights::get_linear_weight(const std::string& name, const Shape& shape, Tensor* scale) const {
  const std::string k = checked_key(name, shape, WeightUse::linear_weight);
  const DType load_as = linear_load_dtype(k);
  Tensor t;
  if (quantize_ && is_floating(load_as) && shape[1] % dtype_block_elems(*quantize_) == 0 && ShapesOnlyLoad::active()) {
    t = ShapesOnlyLoad::weight(shape, *quantize_);
    if (!is_block_quantized(*quantize_) && scale) *scale = from_vector({1.0f}, {}, dtype_);
  } else if (quantize_ && is_floating(load_as) && shape[1] % dtype_block_elems(*quantize_) == 0) {
    // A panel of rows at a time, read (not mapped) from the checkpoint: the float weight is never
    // whole in memory, so quantizing a model takes its quantized size, not its float size too.
    const std::optional<DType> stored = source_->stored_dtype(k);
    const DType read_as = stored && is_floating(*stored) ? *stored : load_as;
    const int64_t N = shape[0], K = shape[1];
    const int64_t panel = std::max<int64_t>(1, kQuantizePanelBytes / (K * 4));
    const auto rows = [&](int64_t r) { return source_->load_slice(k, 0, r, std::min(panel, N - r), read_as); };
    float s = 1;
    if (!is_block_quantized(*quantize_) && scale) {  // fp8: a scale per tensor, from a first pass
      float amax = 0;
      for (int64_t r = 0; r < N; r += panel) amax = std::max(amax, max_abs(rows(r)));
      s = quantization_scale(*quantize_, amax);
    }
    BufferPtr buf = host_allocate(storage_bytes(*quantize_, N * K));
    for (int64_t r = 0; r < N; r += panel) {
      const Tensor q = quantize_weight(rows(r), *quantize_, s, describe() + ": '" + k + "'");
      std::memcpy(static_cast<char*>(buf->data()) + storage_bytes(*quantize_, r * K), q.data_ptr(), q.nbytes());
    }
    t = Tensor::view_of(std::move(buf), shape, *quantize_);
    if (s != 1) {
      *scale = from_vector({s}, {}, dtype_);
      collect_weight(key(name + "_scale"), *scale);  // "<layer>.weight_scale": convert writes it
    }
  } else {
    t = source_->load(k, load_as);
  }
  collect_weight(k, t);
  return t;
}

Tensor Weights::get_linear_weight_slice(const std::string& name, const Shape& shape, int dim, int64_t start,
                                        int64_t length, bool collect) const {
  // Tensor parallelism with quantization at load is refused by the pipeline loader; a stored
  // quantized weight is sliced as stored.
  const std::string k = checked_key(name, shape, WeightUse::linear_weight);
  Tensor t = source_->load_slice(k, dim, start, length, linear_load_dtype(k));
  if (collect) collect_weight(k, t);
  return t;
}

Weights Weights::with_plan(std::shared_ptr<const ShardPlan> plan) const {
  Weights w = *this;
  w.plan_ = std::move(plan);
  return w;
}

bool Weights::has(const std::string& name) const { return source_ && source_->contains(key(name)); }

Shape Weights::stored_shape(const std::string& name) const {
  KILN_CHECK(has(name), "weights", describe(), ": tensor '", key(name), "' is missing");
  return source_->shape(key(name));
}

std::string Weights::checked_key(const std::string& name, const Shape& shape, WeightUse use) const {
  KILN_CHECK(source_ != nullptr, "weights", "no checkpoint loaded for '", key(name), "'");
  const std::string k = key(name);
  source_->expect(k, shape, use);
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

std::vector<Tensor> parameter_values(const NamedParameters& named) {
  std::vector<Tensor> out;
  out.reserve(named.size());
  for (const auto& [key, t] : named) out.push_back(t);
  return out;
}

void ParameterRecorder::record(const std::string& key, const Tensor& t) {
  for_each([&](ParameterRecorder& r) { r.recorded_.emplace_back(key, t); });
}

NamedParameters ParameterRecorder::named(const std::string& prefix) const {
  const std::string strip = prefix.empty() ? prefix : prefix + ".";
  std::map<std::string, Tensor> by_key;
  for (const auto& [key, t] : recorded_)
    by_key[key.compare(0, strip.size(), strip) == 0 ? key.substr(strip.size()) : key] = t;  // a key loaded twice: the last
  return NamedParameters(by_key.begin(), by_key.end());
}

}  // namespace kiln::nn
