#include "nn/gguf_source.h"

#include <mutex>
#include <set>

#include "core/error.h"
#include "io/gguf.h"

namespace kiln::nn {

namespace {

class GgufSource final : public WeightSource {
 public:
  explicit GgufSource(const std::filesystem::path& path) : file_(path) {}
  std::string describe() const override { return file_.path().string(); }
  bool contains(const std::string& key) const override { return file_.contains(key); }
  Shape shape(const std::string& key) const override { return file_.info(key).shape; }
  std::optional<DType> stored_dtype(const std::string& key) const override { return file_.info(key).dtype; }
  Tensor load(const std::string& key, DType dtype) const override {
    check_dtype(key, dtype);
    Tensor t = file_.load(key, dtype);
    read(key);
    return t;
  }
  Tensor load_slice(const std::string& key, int dim, int64_t start, int64_t length, DType dtype) const override {
    check_dtype(key, dtype);
    Tensor t = file_.load_slice(key, dim, start, length, dtype);
    read(key);
    return t;
  }
  std::vector<std::string> names() const override { return file_.names(); }
  std::vector<std::string> unread() const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const std::string& k : file_.names())
      if (!read_.count(k)) out.push_back(k);
    return out;
  }

 private:
  // A float weight stored as integers would be converted into another model.
  void check_dtype(const std::string& key, DType want) const {
    const io::GgufTensorInfo& info = file_.info(key);
    const bool integer = info.dtype == DType::i32 || info.dtype == DType::i64;
    KILN_CHECK(!(is_floating(want) || is_storage_only(want)) || !integer, "weights", describe(), ": tensor '", key,
               "' is stored as ", io::ggml_type_name(info.ggml_type),
               ", expected a floating-point or quantized type for this weight");
  }
  void read(const std::string& key) const {
    std::lock_guard<std::mutex> lock(mu_);
    read_.insert(key);
  }
  io::GgufFile file_;
  mutable std::mutex mu_;
  mutable std::set<std::string> read_;
};

}  // namespace

std::shared_ptr<const WeightSource> open_gguf_source(const std::filesystem::path& path) {
  return std::make_shared<const GgufSource>(path);
}

}  // namespace kiln::nn
