#include "nn/gguf_source.h"

#include "core/error.h"
#include "io/gguf.h"
#include "nn/file_source.h"

namespace kiln::nn {

namespace {

class GgufSource final : public FileSource<io::GgufFile> {
 public:
  using FileSource::FileSource;

 private:
  void check_dtype(const std::string& key, DType want) const override {
    const io::GgufTensorInfo& info = reader().info(key);
    const bool integer = info.dtype == DType::i32 || info.dtype == DType::i64;
    KILN_CHECK(!(is_floating(want) || is_storage_only(want)) || !integer, "weights", describe(), ": tensor '", key,
               "' is stored as ", io::ggml_type_name(info.ggml_type),
               ", expected a floating-point or quantized type for this weight");
  }
};

}  // namespace

std::shared_ptr<const WeightSource> open_gguf_source(const std::filesystem::path& path) {
  return std::make_shared<const GgufSource>(path);
}

}  // namespace kiln::nn
