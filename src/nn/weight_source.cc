#include "nn/weight_source.h"

#include <cstring>
#include <map>

#include "core/error.h"
#include "exec/host.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "nn/file_source.h"
#include "nn/gguf_source.h"

namespace kiln::nn {

namespace {

class SafetensorsSource final : public FileSource<io::SafetensorsIndex> {
 public:
  using FileSource::FileSource;

 private:
  // Named by the shard, which says more than the index when a checkpoint is split.
  void check_dtype(const std::string& key, DType want) const override {
    const io::TensorInfo info = reader().info(key);
    KILN_CHECK(!is_floating(want) || !info.dtype || is_floating(*info.dtype), "weights",
               reader().shard_path(key).string(), ": tensor '", key, "' is stored as ", info.dtype_string,
               ", expected a floating-point dtype (F32, BF16 or F16) for this weight");
  }
};

}  // namespace

DType stored_float_dtype(const WeightSource& source) {
  std::map<DType, int64_t> bytes;
  for (const std::string& key : source.names())
    if (const std::optional<DType> t = source.stored_dtype(key); t && (is_floating(*t) || is_storage_only(*t)))
      // Quantized weights (fp8, GGUF blocks) compute in bf16 under "auto".
      bytes[is_floating(*t) ? *t : DType::bf16] += int64_t(storage_bytes(*t, numel(source.shape(key))));
  DType best = DType::f32;
  int64_t most = -1;
  for (const auto& [t, b] : bytes)
    if (b > most) best = t, most = b;
  return best;
}

Tensor WeightSource::load_slice(const std::string& key, int dim, int64_t start, int64_t length, DType dtype) const {
  const Tensor whole = load(key, dtype);
  KILN_CHECK((whole.rank() == 2 && (dim == 0 || dim == 1)) || (whole.rank() == 1 && dim == 0), "weights", describe(),
             ": '", key, "' ", to_string(whole.shape()), " cannot be sliced along dim ", dim);
  KILN_CHECK(start >= 0 && length >= 0 && start + length <= whole.dim(dim), "weights", describe(), ": '", key,
             "' slice [", start, ", ", start + length, ") of dim ", dim, " is out of range");
  wait(whole);
  const int64_t rows = whole.rank() == 1 || dim == 0 ? (dim == 0 ? length : whole.dim(0)) : whole.dim(0);
  const int64_t cols = whole.rank() == 1 ? 1 : (dim == 1 ? length : whole.dim(1));
  const int64_t full_cols = whole.rank() == 1 ? 1 : whole.dim(1);
  // Byte math through storage_bytes: a block type's columns split only at block boundaries.
  const DType dt = whole.dtype();
  BufferPtr buf = host_allocate(storage_bytes(dt, rows * cols));
  const char* src = static_cast<const char*>(whole.data_ptr());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t src_row = dim == 0 ? start + r : r, src_col = dim == 1 ? start : 0;
    std::memcpy(static_cast<char*>(buf->data()) + storage_bytes(dt, r * cols),
                src + storage_bytes(dt, src_row * full_cols + src_col), storage_bytes(dt, cols));
  }
  return Tensor::view_of(std::move(buf), whole.rank() == 1 ? Shape{rows} : Shape{rows, cols}, dt);
}

std::shared_ptr<const WeightSource> open_checkpoint(const std::filesystem::path& path) {
  // A GGUF file (stable-diffusion.cpp / ComfyUI-GGUF checkpoints, kiln convert's output), told by
  // its magic bytes whatever its name; a ".gguf" name without them is GGUF's parser's to refuse.
  std::shared_ptr<const WeightSource> source;
  if (path.extension() == ".gguf" || io::has_gguf_magic(path))
    source = open_gguf_source(path);
  else
    source = std::make_shared<const SafetensorsSource>(path);
  if (CheckpointAudit* audit = CheckpointAudit::active()) audit->opened(source);
  return source;
}

void CheckpointAudit::opened(std::shared_ptr<const WeightSource> source) { sources_.push_back(std::move(source)); }

bool key_under(const std::string& key, const std::vector<std::string>& prefixes) {
  for (const std::string& prefix : prefixes)
    if (key.starts_with(prefix)) return true;
  return false;
}

std::vector<std::string> CheckpointAudit::unused(const std::vector<std::string>& not_loaded) const {
  std::vector<std::string> out;
  for (const auto& source : sources_) {
    std::vector<std::string> keys;
    for (const std::string& k : source->unread())
      if (!key_under(k, not_loaded)) keys.push_back(k);
    if (keys.empty()) continue;
    std::string list;
    for (size_t i = 0; i < keys.size() && i < 8; ++i) list += (i ? ", '" : "'") + keys[i] + "'";
    if (keys.size() > 8) list += ", ...";
    out.push_back(source->describe() + ": " + list + " (" + std::to_string(keys.size()) + " tensor" +
                  (keys.size() == 1 ? "" : "s") + ")");
  }
  return out;
}

}  // namespace kiln::nn
