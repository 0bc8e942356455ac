// Checkpoints split into shards the way Hugging Face writes them (huggingface_hub's
// split_torch_state_dict_into_shards, used by Diffusers' and transformers' save_pretrained):
// tensors are taken in order and a shard is closed when the next tensor would take it past the
// limit; a tensor larger than the limit gets a shard of its own. One shard is written as
// "<base>.safetensors"; several as "<base>-00001-of-0000N.safetensors", ... plus
// "<base>.safetensors.index.json" ({"metadata": {"total_size": tensor bytes}, "weight_map":
// {tensor: shard file}}), which SafetensorsIndex (io/safetensors.h) reads.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors_stream_writer.h"

namespace kiln::io {

// The shards as lists of tensor positions, for tensors of these sizes.
std::vector<std::vector<size_t>> split_into_shards(const std::vector<uint64_t>& tensor_bytes, uint64_t max_shard_bytes);

// "<base>-00001-of-00003.safetensors" for index 0 of 3 (5 digits, as Hugging Face names them).
std::string shard_file_name(const std::string& base, size_t index, size_t count);

struct WrittenCheckpoint {
  std::vector<std::string> files;  // in `dir`: the shards, then the index (if any)
  uint64_t tensor_bytes = 0;       // the index's total_size
  uint64_t file_bytes = 0;         // every file written, headers and index included
};

// The files and sizes write_sharded_checkpoint would write, without writing anything.
WrittenCheckpoint plan_sharded_checkpoint(const std::string& base, const std::vector<StreamedTensor>& tensors,
                                          uint64_t max_shard_bytes,
                                          const std::map<std::string, std::string>& metadata = {});

// Writes the shards (write_safetensors_streamed) and the index into `dir`, which must exist.
// `metadata` goes into every shard's header. Each file is written atomically, but on an error
// the shards written before it stay: write into a fresh folder and move it into place when
// everything is written (kiln make-random does).
WrittenCheckpoint write_sharded_checkpoint(const std::filesystem::path& dir, const std::string& base,
                                           const std::vector<StreamedTensor>& tensors, uint64_t max_shard_bytes,
                                           const std::map<std::string, std::string>& metadata = {});

}  // namespace kiln::io
