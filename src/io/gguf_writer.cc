#include "io/gguf_writer.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "io/output_file.h"

namespace kiln::io {
namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little, "the GGUF writer writes host order");

namespace {

constexpr const char* kWhere = "gguf";
constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kVersion = 3;
// ggml keeps tensor names in a 64-byte field with its terminating NUL (GGML_MAX_NAME), so a
// longer name makes a file that ggml, llama.cpp and stable-diffusion.cpp refuse.
constexpr size_t kMaxNameBytes = 63;
constexpr size_t kMaxKeyBytes = 65535;

template <typename... Parts>
[[noreturn]] void file_fail(const fs::path& file, const Parts&... parts) {
  fail(kWhere, file.string(), ": ", parts...);
}

uint64_t align_up(uint64_t v, uint64_t alignment) {
  const uint64_t r = v % alignment;
  return r == 0 ? v : v + (alignment - r);
}

template <typename T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

// Arrays' items must be of the array's type (the file gives the type once for all of them).
void check_value(const fs::path& file, const std::string& key, const GgufValue& v) {
  const GgufArray* a = std::get_if<GgufArray>(&v.value);
  if (!a) return;
  if (uint32_t(a->type) > uint32_t(GgufType::f64))
    file_fail(file, "metadata '", key, "': array item type ", uint32_t(a->type), " is not a GGUF type");
  for (size_t i = 0; i < a->items.size(); ++i) {
    if (a->items[i].type() != a->type)
      file_fail(file, "metadata '", key, "': array item ", i, " is ", gguf_type_name(a->items[i].type()),
                " in an array of ", gguf_type_name(a->type));
    check_value(file, key, a->items[i]);
  }
}

void put_value(std::string& out, const GgufValue& v) {
  std::visit(
      [&out](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          put_string(out, x);
        } else if constexpr (std::is_same_v<T, GgufArray>) {
          put<uint32_t>(out, uint32_t(x.type));
          put<uint64_t>(out, x.items.size());
          for (const GgufValue& item : x.items) put_value(out, item);
        } else if constexpr (std::is_same_v<T, bool>) {
          put<uint8_t>(out, x ? 1 : 0);
        } else {
          put<T>(out, x);
        }
      },
      v.value);
}

class FileSink {
 public:
  FileSink(const fs::path& path, std::FILE* f) : path_(path), f_(f) {}
  void write(const void* data, size_t bytes) {
    if (bytes > 0 && std::fwrite(data, 1, bytes, f_) != bytes)
      file_fail(path_, "write failed: ", std::strerror(errno ? errno : EIO));
    written_ += bytes;
  }
  void pad_to(uint64_t offset) {
    static const char kZeros[256] = {};
    while (written_ < offset) write(kZeros, size_t(std::min<uint64_t>(sizeof kZeros, offset - written_)));
  }
  uint64_t written() const { return written_; }

 private:
  const fs::path& path_;
  std::FILE* f_;
  uint64_t written_ = 0;
};

}  // namespace

GgufWriter::GgufWriter(fs::path path, uint32_t alignment) : path_(std::move(path)), alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    file_fail(path_, "alignment ", alignment, " is not a nonzero power of two");
}

void GgufWriter::set_metadata(const std::string& key, GgufValue value) {
  if (key.empty()) file_fail(path_, "a metadata key is empty");
  if (key.size() > kMaxKeyBytes)
    file_fail(path_, "metadata key '", key.substr(0, 40), "...' is ", key.size(), " bytes; GGUF allows ",
              kMaxKeyBytes);
  if (key == "general.alignment") {
    const uint32_t* a = std::get_if<uint32_t>(&value.value);
    if (!a || *a != alignment_)
      file_fail(path_, "metadata 'general.alignment' is ", gguf_type_name(value.type()), " ", value.to_string(),
                ", but the writer's alignment is the u32 ", alignment_, " (set it through the writer)");
  }
  check_value(path_, key, value);
  metadata_.insert_or_assign(key, std::move(value));
}

void GgufWriter::set_metadata(const GgufMetadata& metadata) {
  for (const auto& [key, value] : metadata) set_metadata(key, value);
}

void GgufWriter::check_tensor(const std::string& name, DType dtype, const Shape& shape) const {
  if (name.empty()) file_fail(path_, "a tensor name is empty");
  if (name.size() > kMaxNameBytes)
    file_fail(path_, "tensor name '", name, "' is ", name.size(), " bytes; ggml reads names of at most ",
              kMaxNameBytes);
  for (const Entry& e : tensors_)
    if (e.name == name) file_fail(path_, "tensor '", name, "' is added twice");
  if (!ggml_type_of(dtype))
    file_fail(path_, "tensor '", name, "' has dtype ", dtype_name(dtype),
              ", which has no ggml type (GGUF holds f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, i32, i64)");
  if (shape.size() > 4) file_fail(path_, "tensor '", name, "' has shape ", to_string(shape), "; GGUF allows 4 dims");
  for (int64_t d : shape)
    if (d <= 0) file_fail(path_, "tensor '", name, "' has shape ", to_string(shape), "; every dim must be positive");
  const int64_t block = dtype_block_elems(dtype);
  const int64_t row = shape.empty() ? 1 : shape.back();
  if (row % block != 0)
    file_fail(path_, "tensor '", name, "' (", dtype_name(dtype), ") has shape ", to_string(shape),
              ": its innermost dim is not a multiple of the ", block, "-element block");
}

void GgufWriter::add_tensor(const std::string& name, const Tensor& t) {
  if (!t.defined()) file_fail(path_, "tensor '", name, "' is undefined");
  if (t.device() != Device::cpu())
    file_fail(path_, "tensor '", name, "' is on ", t.device().str(), "; move it to cpu first");
  if (!t.is_contiguous()) file_fail(path_, "tensor '", name, "' (", t.describe(), ") is not contiguous");
  check_tensor(name, t.dtype(), t.shape());
  tensors_.push_back({name, t.dtype(), t.shape(), t.nbytes(), [t](const Emit& emit) { emit(t.data_ptr(), t.nbytes()); }});
}

void GgufWriter::add_tensor(const std::string& name, DType dtype, const Shape& shape, Producer produce) {
  check_tensor(name, dtype, shape);
  if (!produce) file_fail(path_, "tensor '", name, "' has no producer");
  tensors_.push_back({name, dtype, shape, storage_bytes(dtype, numel(shape)), std::move(produce)});
}

std::string GgufWriter::header() const {
  GgufMetadata metadata = metadata_;
  if (alignment_ != kDefaultAlignment) metadata.insert_or_assign("general.alignment", GgufValue{alignment_});
  std::string out = "GGUF";
  put<uint32_t>(out, kVersion);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, metadata.size());
  for (const auto& [key, value] : metadata) {
    put_string(out, key);
    put<uint32_t>(out, uint32_t(value.type()));
    put_value(out, value);
  }
  uint64_t offset = 0;
  for (const Entry& e : tensors_) {
    put_string(out, e.name);
    put<uint32_t>(out, uint32_t(e.shape.size()));
    for (auto d = e.shape.rbegin(); d != e.shape.rend(); ++d) put<uint64_t>(out, uint64_t(*d));
    put<uint32_t>(out, *ggml_type_of(e.dtype));
    put<uint64_t>(out, offset);
    offset = align_up(offset + e.nbytes, alignment_);
  }
  return out;
}

uint64_t GgufWriter::file_bytes() const {
  uint64_t bytes = align_up(header().size(), alignment_);
  for (const Entry& e : tensors_) bytes += align_up(e.nbytes, alignment_);
  return bytes;
}

uint64_t GgufWriter::write() {
  const std::string head = header();
  uint64_t total = 0;
  write_output_atomically(kWhere, path_, [&](std::FILE* f) {
    FileSink out(path_, f);
    out.write(head.data(), head.size());
    out.pad_to(align_up(out.written(), alignment_));
    for (const Entry& e : tensors_) {
      const uint64_t begin = out.written();
      e.produce([&](const void* data, size_t bytes) {
        if (bytes > e.nbytes - (out.written() - begin))
          file_fail(path_, "tensor '", e.name, "': its producer wrote more than the tensor's ", e.nbytes, " bytes");
        out.write(data, bytes);
      });
      if (out.written() - begin != e.nbytes)
        file_fail(path_, "tensor '", e.name, "': its producer wrote ", out.written() - begin, " of the tensor's ",
                  e.nbytes, " bytes");
      out.pad_to(begin + align_up(e.nbytes, alignment_));
    }
    total = out.written();
  });
  return total;
}

uint64_t write_gguf(const fs::path& path, const GgufMetadata& metadata,
                    const std::vector<std::pair<std::string, Tensor>>& tensors, uint32_t alignment) {
  GgufWriter writer(path, alignment);
  writer.set_metadata(metadata);
  for (const auto& [name, t] : tensors) writer.add_tensor(name, t);
  return writer.write();
}

}  // namespace kiln::io
