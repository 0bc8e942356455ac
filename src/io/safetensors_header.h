// The header of a safetensors file being written: tensors in data order, each one's bytes right
// after the previous one's, optional string metadata. Both writers (save_safetensors and the
// streaming writer) build theirs here, so names are checked and offsets laid out one way.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"

namespace kiln::io {

class SafetensorsHeader {
 public:
  // `path` names the file in errors.
  SafetensorsHeader(std::filesystem::path path, std::map<std::string, std::string> metadata);
  // The next tensor: its name must be new, not empty and not "__metadata__".
  void add(const std::string& name, DType dtype, const Shape& shape, uint64_t nbytes);
  // The JSON (entries in data order), padded with spaces so that the data section starts
  // 8-byte aligned and readers can map tensors in place; an error names the file when it cannot
  // be written (a name that is not UTF-8).
  std::string text() const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  std::filesystem::path path_;
  std::map<std::string, std::string> metadata_;
  std::vector<Entry> entries_;
  std::set<std::string> names_;
  uint64_t offset_ = 0;
};

}  // namespace kiln::io
