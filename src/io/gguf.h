// Reading GGUF files (the container of ggml, llama.cpp and stable-diffusion.cpp; specification:
// ggml's docs/gguf.md). Writing them: io/gguf_writer.h.
//
// Layout (little-endian): "GGUF", u32 version (2 or 3), u64 tensor_count, u64 metadata_kv_count,
// the metadata key/value pairs, the tensor infos (name, n_dims, dims innermost first, ggml type,
// offset), padding to general.alignment (default 32), then the data section; each tensor's
// offset is relative to the data section and a multiple of the alignment.
//
// A file is untrusted input: GgufFile validates the whole header (every length against the
// bytes left, counts, duplicate names and keys, dims, types, block sizes, alignment, ranges
// inside the file, overlaps) before exposing anything, and every problem is a kiln::Error naming
// the file and the tensor or key. Tensors of a ggml type kiln does not read (Q5_1, Q6_K, ...)
// are errors at open: the file could not be used as weights anyway.
//
// Shapes: ggml lists dims innermost first (ne[0] is the row length); kiln's Shape is outermost
// first, so the dims are reversed: a ggml [K, N] weight is a kiln [N, K] tensor, the layout of
// the same bytes in PyTorch. Block types (Q8_0, Q4_0, Q4_K, Q5_K) pack each row's elements in
// blocks, so a row's length is a multiple of the block size (checked at open).
//
// Full loads are zero-copy views of a read-only mapping; slice loads pread() exactly the bytes
// needed and are counted in io::bytes_read() as safetensors loads are (io/mapped_file.h).
// Truncating or rewriting a file while it is mapped is not supported (the OS may SIGBUS).
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "core/tensor.h"
#include "io/mapped_file.h"

namespace kiln::io {

// Metadata value types; the numbers are the file's (gguf_metadata_value_type).
enum class GgufType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8,
  array = 9, u64 = 10, i64 = 11, f64 = 12,
};
const char* gguf_type_name(GgufType t);  // "u8", ..., "bool", "string", "array"; "?" otherwise

struct GgufValue;
// An array value: every item is of `type` (items of an array of arrays each carry their own).
struct GgufArray {
  GgufType type = GgufType::u8;
  std::vector<GgufValue> items;
  bool operator==(const GgufArray& o) const;
};

// One metadata value. Alternative i of `value` holds GgufType i, so GgufValue{uint32_t(32)} is a
// u32 and GgufValue{std::string("flux")} a string.
struct GgufValue {
  std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool, std::string,
               GgufArray, uint64_t, int64_t, double>
      value;

  GgufType type() const { return GgufType(value.index()); }
  // The value of an integer of any width (nullopt for other types and u64s above INT64_MAX).
  std::optional<int64_t> as_int() const;
  // The string, or nullptr when the value is not one.
  const std::string* as_string() const;
  // Short text for messages: 32, 1.5, "flux", [u32 x 3].
  std::string to_string() const;
  bool operator==(const GgufValue& o) const = default;
};

using GgufMetadata = std::map<std::string, GgufValue>;

// ggml type ids (enum ggml_type) and kiln's dtypes: F32=0, F16=1, Q4_0=2, Q8_0=8, Q4_K=12,
// Q5_K=13, I32=26, I64=27, BF16=30. fp8 and bool have no ggml type.
const char* ggml_type_name(uint32_t ggml_type);  // "Q5_1", ...; "?" for ids ggml does not define
std::optional<DType> dtype_of_ggml_type(uint32_t ggml_type);
std::optional<uint32_t> ggml_type_of(DType t);

// Whether `path` is a regular file whose first 4 bytes are the magic "GGUF": how a checkpoint's
// format is told whatever its name says (a GGUF renamed .bin or .safetensors is still GGUF).
// Opened as io/input_file.h opens, so a FIFO is never waited on; false for anything else.
bool has_gguf_magic(const std::filesystem::path& path);

struct GgufTensorInfo {
  std::string name;
  uint32_t ggml_type = 0;    // as in the file
  DType dtype = DType::f32;  // kiln's dtype for it
  Shape shape;               // outermost first (ggml's dims reversed)
  uint64_t offset = 0;       // from the start of the data section, as in the file
  uint64_t byte_begin = 0;   // absolute file offsets of the tensor's bytes
  uint64_t byte_end = 0;
  uint64_t nbytes() const { return byte_end - byte_begin; }
};

class GgufFile {
 public:
  // Maps and validates the file; throws kiln::Error naming `path` on any problem.
  explicit GgufFile(const std::filesystem::path& path);
  GgufFile(GgufFile&&) noexcept = default;
  GgufFile& operator=(GgufFile&&) noexcept = default;

  const std::filesystem::path& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute start of the data section

  // Tensor names in file order.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  const GgufTensorInfo& info(const std::string& name) const;  // throws naming file and tensor
  const GgufMetadata& metadata() const { return metadata_; }
  const GgufValue* find_metadata(const std::string& key) const;  // nullptr when absent

  // The tensor in its stored dtype, on kiln::Device::cpu(): a read-only view into the mapping
  // (which stays alive as long as the tensor does), or a copy when its address is not aligned
  // for its dtype (only with general.alignment below the element size).
  Tensor load(const std::string& name) const;
  // As load(name), converted to `want` (into a new buffer) when the stored dtype differs.
  Tensor load(const std::string& name, DType want) const;
  // Rows (dim 0) or columns (dim 1) [start, start+length) of a 2-D tensor, or elements of a 1-D
  // one (dim 0), read with pread() (one read for rows, one per row for columns) into a new
  // buffer, converted to `want`. Of a block type, rows are whole rows; columns and 1-D elements
  // must start and end on block boundaries.
  Tensor load_slice(const std::string& name, int dim, int64_t start, int64_t length,
                    DType want) const;

  // The mapped bytes (whole file), so callers and tests can tell zero-copy tensors apart.
  std::span<const std::byte> mapped_range() const { return file_.bytes(); }

 private:
  void parse();

  MappedFile file_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufTensorInfo> tensors_;    // file order
  std::map<std::string, size_t> by_name_;  // name -> index in tensors_
  GgufMetadata metadata_;
};

}  // namespace kiln::io
