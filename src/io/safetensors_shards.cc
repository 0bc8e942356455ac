#include "io/safetensors_shards.h"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/output_file.h"

namespace kiln::io {

namespace fs = std::filesystem;

std::vector<std::vector<size_t>> split_into_shards(const std::vector<uint64_t>& tensor_bytes,
                                                   uint64_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_bytes = 0;
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    const uint64_t b = tensor_bytes[i];
    if (b > max_shard_bytes) {  // its own shard, ahead of the one being filled (as Hugging Face does)
      shards.push_back({i});
      continue;
    }
    if (current_bytes + b > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += b;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));
  return shards;
}

std::string shard_file_name(const std::string& base, size_t index, size_t count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", index + 1, count);
  return base + buf;
}

namespace {

struct Plan {
  std::vector<std::vector<StreamedTensor>> shards;
  std::vector<std::string> names;  // shard file names
  std::string index_name;          // "" for a single file
  uint64_t tensor_bytes = 0;
};

Plan make_plan(const std::string& base, const std::vector<StreamedTensor>& tensors, uint64_t max_shard_bytes) {
  KILN_CHECK(max_shard_bytes > 0, "safetensors", "the shard size limit must be positive");
  std::vector<uint64_t> sizes;
  Plan p;
  for (const StreamedTensor& t : tensors) {
    sizes.push_back(t.nbytes());
    p.tensor_bytes += t.nbytes();
  }
  for (const std::vector<size_t>& shard : split_into_shards(sizes, max_shard_bytes)) {
    std::vector<StreamedTensor> ts;
    for (size_t i : shard) ts.push_back(tensors[i]);
    p.shards.push_back(std::move(ts));
  }
  if (p.shards.size() == 1) {
    p.names = {base + ".safetensors"};
  } else {
    for (size_t i = 0; i < p.shards.size(); ++i) p.names.push_back(shard_file_name(base, i, p.shards.size()));
    p.index_name = base + ".safetensors.index.json";
  }
  return p;
}

std::string index_text(const Plan& p) {
  nlohmann::json weight_map = nlohmann::json::object();  // sorted by tensor name, as Hugging Face writes it
  for (size_t s = 0; s < p.shards.size(); ++s)
    for (const StreamedTensor& t : p.shards[s]) weight_map[t.name] = p.names[s];
  const nlohmann::json index = {{"metadata", {{"total_size", p.tensor_bytes}}}, {"weight_map", weight_map}};
  return index.dump(2) + "\n";
}

}  // namespace

WrittenCheckpoint plan_sharded_checkpoint(const std::string& base, const std::vector<StreamedTensor>& tensors,
                                          uint64_t max_shard_bytes,
                                          const std::map<std::string, std::string>& metadata) {
  const Plan p = make_plan(base, tensors, max_shard_bytes);
  WrittenCheckpoint w;
  w.tensor_bytes = p.tensor_bytes;
  for (size_t s = 0; s < p.shards.size(); ++s) {
    w.files.push_back(p.names[s]);
    w.file_bytes += streamed_file_bytes(p.shards[s], metadata);
  }
  if (!p.index_name.empty()) {
    w.files.push_back(p.index_name);
    w.file_bytes += index_text(p).size();
  }
  return w;
}

WrittenCheckpoint write_sharded_checkpoint(const fs::path& dir, const std::string& base,
                                           const std::vector<StreamedTensor>& tensors, uint64_t max_shard_bytes,
                                           const std::map<std::string, std::string>& metadata) {
  const Plan p = make_plan(base, tensors, max_shard_bytes);
  WrittenCheckpoint w;
  w.tensor_bytes = p.tensor_bytes;
  for (size_t s = 0; s < p.shards.size(); ++s) {
    w.file_bytes += write_safetensors_streamed(dir / p.names[s], p.shards[s], metadata);
    w.files.push_back(p.names[s]);
  }
  if (!p.index_name.empty()) {
    const std::string text = index_text(p);
    write_output_atomically("safetensors", dir / p.index_name,
                            [&](std::FILE* f) { std::fwrite(text.data(), 1, text.size(), f); });
    w.file_bytes += text.size();
    w.files.push_back(p.index_name);
  }
  return w;
}

}  // namespace kiln::io
