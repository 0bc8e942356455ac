// A checkpoint reader as a WeightSource: what the safetensors source (nn/weight_source.cc) and
// the GGUF source (nn/gguf_source.cc) share. Loads go to the reader, and every key loaded is
// remembered so that unread() can name the tensors a model never used (CheckpointAudit).
//
// `Reader` is io::SafetensorsIndex or io::GgufFile: constructed from a path, with path(),
// contains(key), info(key).shape / .dtype, names(), load(key, dtype) and load_slice(...).
#pragma once
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"

#include "nn/shapes_only_load.h"
#include "nn/weight_source.h"

namespace kiln::nn {

template <typename Reader>
class FileSource : public WeightSource {
 public:
  explicit FileSource(const std::filesystem::path& path) : reader_(path) {}

  std::string describe() const override { return reader_.path().string(); }
  bool contains(const std::string& key) const override { return reader_.contains(key); }
  Shape shape(const std::string& key) const override { return reader_.info(key).shape; }
  std::optional<DType> stored_dtype(const std::string& key) const override { return reader_.info(key).dtype; }
  Tensor load(const std::string& key, DType dtype) const override {
    check_dtype(key, dtype);
    Tensor t = ShapesOnlyLoad::active() ? ShapesOnlyLoad::weight(shape(key), dtype) : reader_.load(key, dtype);
    mark_read(key);
    return t;
  }
  Tensor load_slice(const std::string& key, int dim, int64_t start, int64_t length, DType dtype) const override {
    check_dtype(key, dtype);
    Tensor t;
    if (ShapesOnlyLoad::active()) {
      Shape s = shape(key);
      KILN_CHECK(dim >= 0 && size_t(dim) < s.size() && start >= 0 && length >= 0 && start + length <= s[size_t(dim)],
                 "weights", describe(), ": '", key, "' ", to_string(s), " has no slice [", start, ", ",
                 start + length, ") of dim ", dim);
      s[size_t(dim)] = length;
      t = ShapesOnlyLoad::weight(s, dtype);
    } else {
      t = reader_.load_slice(key, dim, start, length, dtype);
    }
    mark_read(key);
    return t;
  }
  std::vector<std::string> names() const override { return reader_.names(); }
  std::vector<std::string> unread() const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const std::string& k : reader_.names())
      if (!read_.count(k)) out.push_back(k);
    return out;
  }

 protected:
  // Throws when `key` may not be loaded as `want`: a float weight stored as integers would be
  // converted into another model. Each format names the stored type its own way.
  virtual void check_dtype(const std::string& key, DType want) const = 0;
  const Reader& reader() const { return reader_; }

 private:
  void mark_read(const std::string& key) const {
    std::lock_guard<std::mutex> lock(mu_);
    read_.insert(key);
  }

  Reader reader_;
  mutable std::mutex mu_;
  mutable std::set<std::string> read_;
};

}  // namespace kiln::nn
