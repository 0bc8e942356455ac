#include "devices/cuda/nvrtc.h"

#include <nvrtc.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <thread>

#include "core/cache_dir.h"
#include "core/error.h"
#include "devices/cuda/check.h"
#include "devices/cuda/fused_codegen.h"
#include "devices/cuda/libraries.h"

namespace kiln::cuda {

namespace fs = std::filesystem;

namespace {

// The cached file of this source, compiler, architecture and kind, or empty without a cache.
fs::path cache_file(const fs::path& dir, const std::string& source, int arch, CodeKind kind) {
  if (dir.empty()) return {};
  const std::string key = source + "\n//nvrtc " + std::to_string(nvrtc_version()) + " sm_" + std::to_string(arch);
  return dir / (text_hash(key) + (kind == CodeKind::ptx ? ".ptx" : ".cubin"));
}

std::vector<char> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return {};
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Written under a temporary name and renamed, so a reader never sees half a file.
void write_file(const fs::path& p, const std::vector<char>& bytes) {
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  const fs::path tmp = p.string() + ".tmp" + std::to_string(getpid()) + "." +
                       std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out.write(bytes.data(), std::streamsize(bytes.size()))) return;  // a cache that cannot be written is no cache
  }
  fs::rename(tmp, p, ec);
  if (ec) fs::remove(tmp, ec);
}

}  // namespace

int nvrtc_version() {
  int major = 0, minor = 0;
  KILN_NVRTC_CHECK(nvrtc().Version(&major, &minor));
  return major * 1000 + minor * 10;
}

fs::path kernel_cache_dir() {
  const fs::path dir = cache_dir();
  return dir.empty() ? dir : dir / "cuda";
}

CompiledCode nvrtc_compile(const std::string& name, const std::string& source, int arch, CodeKind kind,
                           const fs::path& cache) {
  const fs::path cached = cache_file(cache, source, arch, kind);
  if (!cached.empty())
    if (std::vector<char> bytes = read_file(cached); !bytes.empty()) return {std::move(bytes), true};

  nvrtcProgram prog = nullptr;
  KILN_NVRTC_CHECK(nvrtc().CreateProgram(&prog, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr));
  const std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram*)> owner(&prog, [](nvrtcProgram* p) { nvrtc().DestroyProgram(p); });
  // A real architecture gives a CUBIN (SASS); a virtual one PTX, which the driver compiles.
  const std::string arch_flag =
      std::string("--gpu-architecture=") + (kind == CodeKind::cubin ? "sm_" : "compute_") + std::to_string(arch);
  const char* options[] = {arch_flag.c_str(), "--std=c++17", "--fmad=false"};
  const nvrtcResult compiled = nvrtc().CompileProgram(prog, 3, options);
  if (compiled != NVRTC_SUCCESS) {
    size_t log_size = 0;
    nvrtc().GetProgramLogSize(prog, &log_size);
    std::string log(log_size, '\0');
    if (log_size) nvrtc().GetProgramLog(prog, log.data());
    fail("nvrtc", name, ": ", nvrtc().GetErrorString(compiled), "\n", Lines{log.c_str()});
  }
  std::vector<char> bytes;
  size_t size = 0;
  if (kind == CodeKind::ptx) {
    KILN_NVRTC_CHECK(nvrtc().GetPTXSize(prog, &size));
    bytes.resize(size);
    KILN_NVRTC_CHECK(nvrtc().GetPTX(prog, bytes.data()));
  } else {
    KILN_NVRTC_CHECK(nvrtc().GetCUBINSize(prog, &size));
    bytes.resize(size);
    KILN_NVRTC_CHECK(nvrtc().GetCUBIN(prog, bytes.data()));
  }
  if (!cached.empty()) write_file(cached, bytes);
  return {std::move(bytes), false};
}

}  // namespace kiln::cuda
