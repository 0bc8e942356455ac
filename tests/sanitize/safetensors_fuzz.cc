// Seeded mutation fuzzing of the safetensors reader, built with ASan + UBSan: every corrupted
// file must either load or be rejected with kiln::Error; anything else (another exception, an
// out-of-bounds access, undefined behaviour) fails the run. Usage: safetensors_fuzz [cases].
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "../safetensors_fuzzing.h"

namespace fs = std::filesystem;
using kiln::DType;
using kiln::Tensor;

using namespace kiln::test;

int main(int argc, char** argv) {
  const long cases = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 20000;
  const fs::path dir =
      fs::temp_directory_path() / ("kiln_safetensors_fuzz_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string valid = valid_file(dir / "valid.safetensors");
  const uint64_t header_len = read_le64(valid);
  const fs::path path = dir / "case.safetensors";

  SplitMix64 rng{0x6b696c6e};  // "kiln"
  long opened = 0, rejected = 0;
  int status = 0;
  for (long i = 0; i < cases; ++i) {
    std::string bytes = valid;
    for (uint64_t m = 1 + rng.below(2); m > 0; --m) mutate_once(bytes, header_len, rng);
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), std::streamsize(bytes.size()));
    try {
      open_and_load_all(path);
      ++opened;
    } catch (const kiln::Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "safetensors_fuzz: case %ld threw a non-kiln exception: %s\n", i,
                   e.what());
      status = 1;
      break;
    }
  }
  fs::remove_all(dir);
  if (status != 0) return status;
  std::printf("safetensors_fuzz: %ld cases, 0 crashes\n", cases);
  std::printf("safetensors_fuzz: %ld opened, %ld rejected with kiln::Error\n", opened, rejected);
  return 0;
}
