// Seeded mutation fuzzing of the GGUF reader, built with ASan + UBSan: every corrupted file must
// either load or be rejected with kiln::Error; anything else (another exception, an
// out-of-bounds access, undefined behaviour) fails the run. Usage: gguf_fuzz [cases].
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "io/gguf.h"
#include "../gguf_fuzzing.h"

namespace fs = std::filesystem;
using namespace kiln::test;

int main(int argc, char** argv) {
  const long cases = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 20000;
  const fs::path dir = fs::temp_directory_path() / ("kiln_gguf_fuzz_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string valid = valid_gguf_file(dir / "valid.gguf");
  const uint64_t header_len = kiln::io::GgufFile(dir / "valid.gguf").data_offset();

  SplitMix64 rng{0x6b696c6e};  // "kiln"
  const GgufFuzzResult r = fuzz_gguf(valid, header_len, dir / "case.gguf", rng, cases);
  fs::remove_all(dir);
  if (!r.failure.empty()) {
    std::fprintf(stderr, "gguf_fuzz: %s\n", r.failure.c_str());
    return 1;
  }
  std::printf("gguf_fuzz: %ld cases, 0 crashes\n", cases);
  std::printf("gguf_fuzz: %ld opened, %ld rejected with kiln::Error\n", r.opened, r.rejected);
  return 0;
}
