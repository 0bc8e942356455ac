// Input files (io/input_file.h): a FIFO, socket, device or folder where a file is read is refused
// at once, saying what it is, never waited on; a checkpoint's format is told by its magic bytes,
// not its name. The CLI's messages for the same are the bad-input corpus's (cases_inputs.cc).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "io/gguf.h"
#include "io/input_file.h"
#include "io/json_config.h"
#include "io/safetensors.h"
#include "nn/weight_source.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

class InputFile : public ::testing::Test {
 protected:
  test::ScopedTempDir tmp_{"if"};  // short: a socket path must fit sun_path
  const fs::path dir_ = tmp_.path();
};

// A FIFO with no writer: a plain open(O_RDONLY) would block here forever. Every reader refuses it
// at once (the whole test is bounded by the ctest timeout; each call returns in microseconds).
TEST_F(InputFile, AFifoIsRefusedByEveryReaderWithoutBlocking) {
  const fs::path fifo = dir_ / "p.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  EXPECT_EQ(io::input_file_problem(fifo), "is a FIFO, not a regular file");
  std::string problem;
  EXPECT_EQ(io::open_input_file(fifo, &problem), -1);
  EXPECT_EQ(problem, "is a FIFO, not a regular file");
  test::expect_error([&] { io::read_input_file("x", fifo, "a JSON file"); },
                     {"[x] " + fifo.string() + " is a FIFO, not a regular file; expected a JSON file"});
  test::expect_error([&] { io::SafetensorsFile f(fifo); },
                     {"[safetensors] " + fifo.string(), "is a FIFO, not a regular file", "expected a safetensors file"});
  test::expect_error([&] { io::JsonConfig c(fifo); }, {"[config] ", "is a FIFO", "expected a JSON config file"});
  EXPECT_FALSE(io::has_gguf_magic(fifo));
  test::expect_error([&] { (void)nn::open_checkpoint(fifo); }, {"is a FIFO, not a regular file"});
}

// Each kind of node is named as what it is; a regular file (also through a link) passes.
TEST_F(InputFile, EachKindIsNamed) {
  std::ofstream(dir_ / "f") << "{}";
  fs::create_symlink(dir_ / "f", dir_ / "link");
  fs::create_directories(dir_ / "d");
  const fs::path sock = dir_ / "s";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, sock.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
  ::close(fd);
  EXPECT_EQ(io::input_file_problem(dir_ / "f"), "");
  EXPECT_EQ(io::input_file_problem(dir_ / "link"), "");
  EXPECT_EQ(io::read_input_file("x", dir_ / "link", "a file"), "{}");
  EXPECT_EQ(io::input_file_problem(dir_ / "d"), "is a folder, not a regular file");
  EXPECT_EQ(io::input_file_problem(sock), "is a socket, not a regular file");
  EXPECT_EQ(io::input_file_problem("/dev/null"), "is a character device, not a regular file");
  EXPECT_EQ(io::input_file_problem(dir_ / "none"), "does not exist (No such file or directory)");
  test::expect_error([&] { io::check_input_file("cli", "--vae /dev/null", "/dev/null", "a checkpoint"); },
                     {"[cli] --vae /dev/null is a character device, not a regular file; expected a checkpoint"});
}

// A GGUF file is read as GGUF whatever its name (it used to be parsed as safetensors unless it
// ended in .gguf); a safetensors file is still safetensors.
TEST_F(InputFile, GgufIsToldByItsMagicWhateverItsName) {
  const fs::path original = fs::path(KILN_FIXTURES_DIR) / "gguf" / "mixed.gguf";
  const auto want = nn::open_checkpoint(original)->names();
  ASSERT_FALSE(want.empty());
  for (const char* name : {"mixed.bin", "mixed.safetensors", "mixed"}) {
    SCOPED_TRACE(name);
    fs::copy_file(original, dir_ / name);
    EXPECT_TRUE(io::has_gguf_magic(dir_ / name));
    EXPECT_EQ(nn::open_checkpoint(dir_ / name)->names(), want);
  }
  const fs::path st = fs::path(KILN_FIXTURES_DIR) / "flux1_tiny" / "pipeline" / "vae" /
                      "diffusion_pytorch_model.safetensors";
  EXPECT_FALSE(io::has_gguf_magic(st));
  EXPECT_EQ(nn::open_checkpoint(st)->names(), io::SafetensorsFile(st).names());
}

}  // namespace
}  // namespace kiln
