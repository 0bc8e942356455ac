#include "io/safetensors_stream_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <future>
#include <mutex>
#include <utility>


#include "core/error.h"
#include "io/output_file.h"
#include "io/safetensors.h"
#include "io/safetensors_header.h"

namespace kiln::io {

namespace fs = std::filesystem;

namespace {

constexpr const char* kWhere = "safetensors";
// Bytes produced and written at a time: large enough that a write is one cheap syscall, small
// enough that the two buffers in flight cost nothing next to a checkpoint.
constexpr int64_t kChunkBytes = int64_t(16) << 20;
// Elements one thread fills at a time (its f32 scratch for 16-bit dtypes).
constexpr int64_t kBlockElements = int64_t(1) << 14;

template <typename... Parts>
[[noreturn]] void file_fail(const fs::path& file, const Parts&... parts) {
  fail(kWhere, file.string(), ": ", parts...);
}

std::string errno_text(int err) { return std::strerror(err); }

// The JSON header, padded with spaces so that the data section starts 8-byte aligned.
std::string build_header(const fs::path& path, const std::vector<StreamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  SafetensorsHeader header(path, metadata);
  for (const StreamedTensor& t : tensors) {
    if (t.dtype == DType::boolean)
      file_fail(path, "tensor '", t.name, "' has dtype ", dtype_name(t.dtype),
                "; streamed tensors are f32, bf16, f16, i32 or i64");
    for (int64_t d : t.shape)
      if (d < 0) file_fail(path, "tensor '", t.name, "' has a negative dimension in ", to_string(t.shape));
    header.add(t.name, t.dtype, t.shape, t.nbytes());
  }
  return header.text();
}

// Elements [begin, begin + count) of `t` in its dtype at `out`, filled by all threads.
void produce(const StreamedTensor& t, int64_t begin, int64_t count, void* out) {
  const int64_t blocks = (count + kBlockElements - 1) / kBlockElements;
  std::exception_ptr error;
  std::mutex error_mu;
#pragma omp parallel
  {
    std::vector<float> scratch(t.dtype == DType::f32 ? 0 : size_t(kBlockElements));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t first = b * kBlockElements, n = std::min(kBlockElements, count - first);
      try {
        if (t.dtype == DType::f32) {
          t.fill(begin + first, n, static_cast<float*>(out) + first);
        } else {
          t.fill(begin + first, n, scratch.data());
          char* dst = static_cast<char*>(out) + first * int64_t(dtype_size(t.dtype));
          convert_from_f32(scratch.data(), dst, t.dtype, n);
        }
      } catch (...) {  // an exception must not leave an OpenMP region
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

// A temporary file next to the target, renamed onto it by commit(); removed if never committed.
class TempFile {
 public:
  explicit TempFile(const fs::path& target) : target_(target) {
    const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
    const std::string name = target.filename().string();
    remove_stale_temporaries(dir, name);  // left by a killed run
    static std::atomic<uint64_t> counter{0};
    for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
      path_ = dir / ("." + name + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1)));
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ < 0 && errno != EEXIST) break;
    }
    if (fd_ < 0) file_fail(target_, "cannot create a temporary file in ", dir.string(), ": ", errno_text(errno));
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  // Safe to call from another thread than the one that constructed the file.
  void write(const void* data, size_t bytes) const {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t w = ::write(fd_, p, bytes);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) file_fail(target_, "write failed: ", errno_text(errno));
      p += w;
      bytes -= size_t(w);
    }
  }

  // Leaves `bytes` unwritten (a hole) at the end of the file.
  void skip(size_t bytes) const {
    const off_t end = ::lseek(fd_, 0, SEEK_END);
    if (end < 0 || ::ftruncate(fd_, end + off_t(bytes)) != 0 || ::lseek(fd_, 0, SEEK_END) < 0)
      file_fail(target_, "cannot extend the file: ", errno_text(errno));
  }

  void commit() {
    if (::fsync(fd_) != 0) file_fail(target_, "fsync failed: ", errno_text(errno));
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) file_fail(target_, "close failed: ", errno_text(errno));
    if (::rename(path_.c_str(), target_.c_str()) != 0)
      file_fail(target_, "cannot rename ", path_.string(), " into place: ", errno_text(errno));
    committed_ = true;
  }

 private:
  fs::path target_, path_;
  int fd_ = -1;
  bool committed_ = false;
};

// One write in flight on its own thread, so the disk works while the next chunk is produced.
class BackgroundWriter {
 public:
  explicit BackgroundWriter(const TempFile& file) : file_(file) {}
  ~BackgroundWriter() {
    if (pending_.valid()) pending_.wait();  // never leave a thread writing into a freed buffer
  }
  void write(const void* data, size_t bytes) {
    wait();
    pending_ = std::async(std::launch::async, [this, data, bytes] { file_.write(data, bytes); });
  }
  void wait() {
    if (pending_.valid()) pending_.get();  // rethrows the write's error
  }

 private:
  const TempFile& file_;
  std::future<void> pending_;
};

}  // namespace

uint64_t streamed_file_bytes(const std::vector<StreamedTensor>& tensors,
                             const std::map<std::string, std::string>& metadata) {
  uint64_t bytes = 8 + build_header("(size estimate)", tensors, metadata).size();
  for (const StreamedTensor& t : tensors) bytes += t.nbytes();
  return bytes;
}

uint64_t write_safetensors_streamed(const fs::path& path, const std::vector<StreamedTensor>& tensors,
                                    const std::map<std::string, std::string>& metadata) {
  const std::string header = build_header(path, tensors, metadata);
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(header.size()) >> (8 * i));
  TempFile file(path);
  file.write(len, sizeof len);
  file.write(header.data(), header.size());
  uint64_t bytes = sizeof len + header.size();
  // Two buffers: one being written while the other is filled. f32 storage fits every dtype.
  std::vector<float> buffers[2] = {std::vector<float>(size_t(kChunkBytes / 4)),
                                   std::vector<float>(size_t(kChunkBytes / 4))};
  {
    BackgroundWriter writer(file);
    int current = 0;
    for (const StreamedTensor& t : tensors) {
      if (!t.fill) {
        writer.wait();
        file.skip(t.nbytes());
        bytes += t.nbytes();
        continue;
      }
      const int64_t n = numel(t.shape), chunk = kChunkBytes / int64_t(dtype_size(t.dtype));
      for (int64_t begin = 0; begin < n; begin += chunk) {
        const int64_t count = std::min(chunk, n - begin);
        produce(t, begin, count, buffers[current].data());
        writer.write(buffers[current].data(), size_t(count) * dtype_size(t.dtype));
        current ^= 1;
      }
      bytes += t.nbytes();
    }
    writer.wait();
  }
  file.commit();
  return bytes;
}

}  // namespace kiln::io
