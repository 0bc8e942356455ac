#include "nn/weight_source.h"

#include <cstring>

#include "core/error.h"
#include "exec/host.h"
#include "io/safetensors.h"

namespace kiln::nn {

namespace {

class SafetensorsSource final : public WeightSource {
 public:
  explicit SafetensorsSource(const std::filesystem::path& path) : index_(path) {}
  std::string describe() const override { return index_.path().string(); }
  bool contains(const std::string& key) const override { return index_.contains(key); }
  Shape shape(const std::string& key) const override { return index_.info(key).shape; }
  Tensor load(const std::string& key, DType dtype) const override { return index_.load(key, dtype); }
  Tensor load_slice(const std::string& key, int dim, int64_t start, int64_t length, DType dtype) const override {
    return index_.load_slice(key, dim, start, length, dtype);
  }

 private:
  io::SafetensorsIndex index_;
};

}  // namespace

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
  const size_t es = dtype_size(dtype);
  BufferPtr buf = host_allocate(size_t(rows * cols) * es);
  const char* src = static_cast<const char*>(whole.data_ptr());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t src_row = dim == 0 ? start + r : r, src_col = dim == 1 ? start : 0;
    std::memcpy(static_cast<char*>(buf->data()) + size_t(r * cols) * es, src + size_t(src_row * full_cols + src_col) * es,
                size_t(cols) * es);
  }
  return Tensor::view_of(std::move(buf), whole.rank() == 1 ? Shape{rows} : Shape{rows, cols}, dtype);
}

std::shared_ptr<const WeightSource> open_checkpoint(const std::filesystem::path& path) {
  return std::make_shared<const SafetensorsSource>(path);
}

}  // namespace kiln::nn
