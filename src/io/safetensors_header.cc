#include "io/safetensors_header.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"

namespace kiln::io {

SafetensorsHeader::SafetensorsHeader(std::filesystem::path path, std::map<std::string, std::string> metadata)
    : path_(std::move(path)), metadata_(std::move(metadata)) {}

void SafetensorsHeader::add(const std::string& name, DType dtype, const Shape& shape, uint64_t nbytes) {
  KILN_CHECK(!name.empty() && name != "__metadata__", "safetensors", path_.string(), ": invalid tensor name '", name,
             "'");
  KILN_CHECK(names_.insert(name).second, "safetensors", path_.string(), ": tensor '", name, "' given twice");
  entries_.push_back({name, dtype, shape, offset_, offset_ + nbytes});
  offset_ += nbytes;
}

std::string SafetensorsHeader::text() const {
  // ordered_json keeps entries in data order, which makes files easy to inspect.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json md = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) md[k] = v;
    header["__metadata__"] = std::move(md);
  }
  for (const Entry& e : entries_)
    header[e.name] = {{"dtype", safetensors_dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& ex) {  // e.g. a name that is not valid UTF-8
    fail("safetensors", path_.string(), ": cannot write the header: ", ex.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace kiln::io
