#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <system_error>
#include <utility>
#include <vector>

#include "core/mapped_pages.h"
#include "io/input_file.h"

namespace kiln::io {
namespace fs = std::filesystem;

namespace {

std::atomic<uint64_t> g_bytes_read{0};
thread_local uint64_t t_bytes_read = 0;

std::string errno_text() { return std::error_code(errno, std::generic_category()).message(); }

// "[a, b)" without overflowing when a + b does not fit.
std::string range_text(int64_t start, int64_t length) {
  std::ostringstream os;
  int64_t end = 0;
  os << '[' << start << ", ";
  if (__builtin_add_overflow(start, length, &end))
    os << start << '+' << length;
  else
    os << end;
  os << ')';
  return os.str();
}

// Integer conversion kept in 64 bits so that large i64 values survive i64 <-> i32/bool.
int64_t load_int(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::i32: return static_cast<const int32_t*>(data)[i];
    case DType::i64: return static_cast<const int64_t*>(data)[i];
    case DType::boolean: return static_cast<const uint8_t*>(data)[i] != 0;
    default: return 0;
  }
}

void store_int(void* data, DType t, int64_t i, int64_t v) {
  switch (t) {
    case DType::i32: static_cast<int32_t*>(data)[i] = int32_t(v); return;
    case DType::i64: static_cast<int64_t*>(data)[i] = v; return;
    case DType::boolean: static_cast<uint8_t*>(data)[i] = v != 0; return;
    default: return;
  }
}

bool is_integer_type(DType t) { return t == DType::i32 || t == DType::i64 || t == DType::boolean; }

// `n` elements (whole rows, so whole blocks) of `from` as `to`: integers among themselves in 64
// bits, everything else through f32 a chunk at a time (block types dequantize/quantize there).
void convert_elements(const void* src, DType from, void* dst, DType to, int64_t n) {
  if (from == to) {
    std::memcpy(dst, src, storage_bytes(from, n));
  } else if (is_integer_type(from) && is_integer_type(to)) {
    for (int64_t i = 0; i < n; ++i) store_int(dst, to, i, load_int(src, from, i));
  } else if (to == DType::f32) {
    convert_to_f32(src, from, static_cast<float*>(dst), n);
  } else if (from == DType::f32) {
    convert_from_f32(static_cast<const float*>(src), dst, to, n);
  } else {
    constexpr int64_t kChunk = 4096;  // a whole number of blocks of every type
    std::vector<float> f(size_t(std::min(n, kChunk)));
    for (int64_t i = 0; i < n; i += kChunk) {
      const int64_t c = std::min(kChunk, n - i);
      convert_to_f32(static_cast<const char*>(src) + storage_bytes(from, i), from, f.data(), c);
      convert_from_f32(f.data(), static_cast<char*>(dst) + storage_bytes(to, i), to, c);
    }
  }
}

// Weights that cannot be used in place (converted, misaligned, sliced) live in host memory.
Tensor convert_tensor(const Tensor& src, DType want) {
  BufferPtr buf = host_allocate(storage_bytes(want, src.numel()));
  convert_elements(src.data_ptr(), src.dtype(), buf->data(), want, src.numel());
  return Tensor::view_of(std::move(buf), src.shape(), want);
}

// The alignment kernels need to read a tensor of `t` in place: its element size, or the f16
// scales' 2 bytes for block types.
size_t natural_alignment(DType t) { return is_block_quantized(t) ? 2 : dtype_size(t); }

}  // namespace

uint64_t bytes_read() { return g_bytes_read.load(std::memory_order_relaxed); }
void reset_bytes_read() { g_bytes_read.store(0, std::memory_order_relaxed); }
void count_bytes_read(uint64_t bytes) {
  g_bytes_read.fetch_add(bytes, std::memory_order_relaxed);
  t_bytes_read += bytes;
}
uint64_t bytes_read_by_this_thread() { return t_bytes_read; }

struct MappedFile::Mapping {
  void* base = nullptr;
  size_t size = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base) ::munmap(base, size);
  }
};

MappedFile::MappedFile(const fs::path& path, const char* where) : path_(path), where_(where) {
  // Never a blocking open: a FIFO, socket, device or folder is refused (io/input_file.h).
  std::string problem;
  fd_ = open_input_file(path, &problem);
  if (fd_ < 0) {
    if (!problem.starts_with("is ")) fail("cannot open: it ", problem);  // missing or unreadable
    fail("it ", problem, "; expected a ", where_, " file");
  }
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail("cannot stat: ", errno_text());
    const uint64_t size = uint64_t(st.st_size);
    mapping_ = std::make_shared<Mapping>();
    if (size > 0) {  // mmap refuses empty files
      void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd_, 0);
      if (base == MAP_FAILED) fail("cannot mmap ", size, " bytes: ", errno_text());
      mapping_->base = base;
      mapping_->size = size;
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

MappedFile::~MappedFile() {
  if (fd_ >= 0) ::close(fd_);
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)),
      where_(o.where_),
      fd_(std::exchange(o.fd_, -1)),
      mapping_(std::move(o.mapping_)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    where_ = o.where_;
    fd_ = std::exchange(o.fd_, -1);
    mapping_ = std::move(o.mapping_);
  }
  return *this;
}

std::span<const std::byte> MappedFile::bytes() const {
  if (!mapping_) return {};
  return {static_cast<const std::byte*>(mapping_->base), mapping_->size};
}

Tensor MappedFile::view(uint64_t byte_begin, const Shape& shape, DType dtype) const {
  auto* src = static_cast<std::byte*>(mapping_->base) + byte_begin;
  const size_t bytes = storage_bytes(dtype, numel(shape));
  count_bytes_read(bytes);
  // Headers whose length is not a multiple of 8 (safetensors) or an alignment below the
  // element size (GGUF, legal but never written in practice) leave data misaligned.
  if (bytes == 0 || reinterpret_cast<uintptr_t>(src) % natural_alignment(dtype) == 0) {
    auto keep_mapped = mapping_;
    auto buf = std::make_shared<Buffer>(src, bytes, Device::cpu(), [keep_mapped] {});
    buf->mark_file_mapping();
    return Tensor::view_of(std::move(buf), shape, dtype);
  }
  BufferPtr buf = host_allocate(bytes);
  std::memcpy(buf->data(), src, bytes);
  return Tensor::view_of(std::move(buf), shape, dtype);
}

Tensor MappedFile::load(uint64_t byte_begin, const Shape& shape, DType dtype, DType want) const {
  Tensor t = view(byte_begin, shape, dtype);
  if (dtype == want) return t;
  Tensor converted = convert_tensor(t, want);
  // The converted copy is what stays in memory: the mapped pages read for it (wholly inside this
  // tensor) leave the process's resident set. The mapping is read-only, so a later read of them
  // (none is expected) would fault them in from the file again.
  if (t.buffer()->maps_file()) release_mapped_pages(t.data_ptr(), t.nbytes());
  return converted;
}

void MappedFile::pread_exact(void* dst, size_t bytes, uint64_t offset,
                             const std::string& what) const {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t r =
        ::pread(fd_, static_cast<char*>(dst) + done, bytes - done, off_t(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      fail(what, ": reading ", bytes, " bytes at offset ", offset, " failed: ", errno_text());
    if (r == 0)
      fail(what, ": file ended at byte ", offset + done, " while reading ", bytes,
           " bytes at offset ", offset, " (was it truncated after opening?)");
    done += size_t(r);
    count_bytes_read(uint64_t(r));
  }
}

Tensor MappedFile::load_slice(uint64_t byte_begin, const Shape& shape, DType dtype,
                              const std::string& what, int dim, int64_t start, int64_t length,
                              DType want) const {
  const bool vector = shape.size() == 1 && dim == 0;
  if (shape.size() != 2 && !vector)
    fail(what, " has shape ", to_string(shape),
         "; load_slice needs a 2-D tensor (or rows of a 1-D one)");
  if (dim != 0 && dim != 1) fail(what, ": slice dim ", dim, " must be 0 (rows) or 1 (columns)");
  const int64_t size = shape[size_t(dim)];
  if (start < 0 || length < 0 || start > size || length > size - start)
    fail(what, ": slice ", range_text(start, length), " of dim ", dim, " is out of range: dim ",
         dim, " has size ", size);
  // Rows of a 2-D tensor are whole rows; otherwise the slice cuts inside rows, where a block
  // type's elements can only be split between blocks.
  const int64_t block = dtype_block_elems(dtype);
  if ((vector || dim == 1) && (start % block != 0 || length % block != 0))
    fail(what, " (", dtype_name(dtype), ", ", block, "-element blocks): slice ",
         range_text(start, length), " of dim ", dim, " must start and end on a block boundary");

  Tensor t;
  if (vector) {  // elements [start, start+length) of a bias or the like: one read
    const size_t bytes = storage_bytes(dtype, length);
    BufferPtr buf = host_allocate(bytes);
    pread_exact(buf->data(), bytes, byte_begin + storage_bytes(dtype, start), what);
    t = Tensor::view_of(std::move(buf), Shape{length}, dtype);
  } else {
    const int64_t rows = dim == 0 ? length : shape[0];
    const int64_t cols = dim == 0 ? shape[1] : length;
    const size_t row_bytes = storage_bytes(dtype, shape[1]);  // a full row in the file
    const size_t out_row_bytes = storage_bytes(dtype, cols);
    BufferPtr buf = host_allocate(size_t(rows) * out_row_bytes);
    auto* dst = static_cast<char*>(buf->data());
    if (dim == 0) {
      pread_exact(dst, size_t(rows) * out_row_bytes, byte_begin + uint64_t(start) * row_bytes,
                  what);
    } else if (out_row_bytes > 0) {
      const size_t col_offset = storage_bytes(dtype, start);
      for (int64_t r = 0; r < rows; ++r)
        pread_exact(dst + size_t(r) * out_row_bytes, out_row_bytes,
                    byte_begin + uint64_t(r) * row_bytes + col_offset, what);
    }
    t = Tensor::view_of(std::move(buf), Shape{rows, cols}, dtype);
  }
  return dtype == want ? t : convert_tensor(t, want);
}

}  // namespace kiln::io
