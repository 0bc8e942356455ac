#include "random_checkpoint/random_component.h"

#include <cstdio>

#include "core/error.h"
#include "io/output_file.h"
#include "io/safetensors_shards.h"

namespace kiln::random_weights {

namespace fs = std::filesystem;

namespace {

// Diffusers and transformers both write {"format": "pt"} into every safetensors header.
const std::map<std::string, std::string> kMetadata{{"format", "pt"}};

std::string config_text(const nlohmann::json& config) { return config.dump(2) + "\n"; }

}  // namespace

int64_t RandomComponent::parameters() const {
  int64_t n = 0;
  for (const RandomTensor& t : tensors) n += numel(t.shape);
  return n;
}

const char* torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    default: return "float32";
  }
}

std::vector<io::StreamedTensor> streamed_tensors(const RandomComponent& c, DType dtype, uint64_t seed,
                                                 bool layout_only) {
  std::vector<io::StreamedTensor> out;
  out.reserve(c.tensors.size());
  for (const RandomTensor& t : c.tensors) {
    const uint64_t key = tensor_key(seed, c.folder + "/" + t.name);
    const Init init = t.init;
    out.push_back({t.name, t.dtype.value_or(dtype), t.shape, nullptr});
    if (!layout_only)
      out.back().fill = [key, init](int64_t begin, int64_t count, float* dst) { fill(init, key, begin, count, dst); };
  }
  return out;
}

WrittenComponent plan_random_component(const RandomComponent& c, DType dtype) {
  const io::WrittenCheckpoint w =
      io::plan_sharded_checkpoint(c.weights_base, streamed_tensors(c, dtype, 0), c.max_shard_bytes, kMetadata);
  WrittenComponent out{c.folder, int64_t(c.tensors.size()), c.parameters(), 0, {"config.json"}};
  out.bytes = config_text(c.config).size() + w.file_bytes;
  out.files.insert(out.files.end(), w.files.begin(), w.files.end());
  return out;
}

WrittenComponent write_random_component(const fs::path& dir, const RandomComponent& c, DType dtype, uint64_t seed,
                                        bool layout_only) {
  const fs::path folder = dir / c.folder;
  std::error_code ec;
  fs::create_directories(folder, ec);
  KILN_CHECK(!ec, "make-random", "cannot create ", folder.string(), ": ", ec.message());
  const std::string text = config_text(c.config);
  io::write_output_atomically("make-random", folder / "config.json",
                              [&](std::FILE* f) { std::fwrite(text.data(), 1, text.size(), f); });
  const io::WrittenCheckpoint w = io::write_sharded_checkpoint(folder, c.weights_base, streamed_tensors(c, dtype, seed, layout_only),
                                                               c.max_shard_bytes, kMetadata);
  WrittenComponent out{c.folder, int64_t(c.tensors.size()), c.parameters(), text.size() + w.file_bytes,
                       {"config.json"}};
  out.files.insert(out.files.end(), w.files.begin(), w.files.end());
  return out;
}

}  // namespace kiln::random_weights
