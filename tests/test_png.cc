// PNG writer/reader: round trip with text metadata, the fixtures' PIL-written image.png,
// atomic writes (no partial or temporary file left behind on success or failure).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "golden.h"
#include "io/png.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

class Png : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_png_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  static std::vector<uint8_t> pattern(int64_t h, int64_t w) {
    std::vector<uint8_t> rgb(size_t(h * w * 3));
    for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = uint8_t((i * 37 + i / 7) & 0xff);
    return rgb;
  }
  fs::path dir_;
};

TEST_F(Png, RoundTripWithMetadata) {
  const auto rgb = pattern(5, 7);
  const io::PngText meta = {{"prompt", "A painting of a squirrel eating a burger"},
                            {"seed", "42"},
                            {"steps", "4"},
                            {"size", "7x5"},
                            {"model", "black-forest-labs/FLUX.1-schnell"},
                            {"negative", "caf\xc3\xa9 \xe6\xbc\xa2\xe5\xad\x97"},  // UTF-8 -> iTXt
                            {"empty", ""}};
  const fs::path path = dir_ / "out.png";
  io::write_png(path, rgb.data(), 5, 7, meta);
  const io::PngImage img = io::read_png(path);
  EXPECT_EQ(img.height, 5);
  EXPECT_EQ(img.width, 7);
  EXPECT_EQ(img.rgb, rgb);
  EXPECT_EQ(img.text, meta);
  EXPECT_EQ(listing(), std::vector<std::string>{"out.png"});  // no temporary file remains
}

TEST_F(Png, OverwritesAnExistingFile) {
  const fs::path path = dir_ / "img.png";
  const auto a = pattern(3, 3);
  std::vector<uint8_t> b(a.size(), 200);
  io::write_png(path, a.data(), 3, 3);
  io::write_png(path, b.data(), 3, 3, {{"seed", "1"}});
  const io::PngImage img = io::read_png(path);
  EXPECT_EQ(img.rgb, b);
  EXPECT_EQ(img.text, (io::PngText{{"seed", "1"}}));
  EXPECT_EQ(listing(), std::vector<std::string>{"img.png"});
}

TEST_F(Png, FixtureImageEqualsGoldenUint8) {
  for (const std::string set : {"flux1_tiny", "flux1_tiny_arch"}) {
    const io::PngImage img = io::read_png(test::fixture(set) / "image.png");
    ASSERT_EQ(test::golden_file(set).info("image.uint8").shape, (Shape{img.height, img.width, 3})) << set;
    EXPECT_EQ(img.rgb, test::golden_u8(set, "image.uint8")) << set;
  }
}

TEST_F(Png, UnwritablePathsLeaveNoFile) {
  const auto rgb = pattern(2, 2);
  // Missing folder.
  const fs::path missing = dir_ / "no_such_dir" / "x.png";
  test::expect_error([&] { io::write_png(missing, rgb.data(), 2, 2); },
                     {"[png] cannot write " + missing.string() + ": ", "No such file or directory"});
  EXPECT_FALSE(fs::exists(missing));
  // The parent is a regular file.
  std::ofstream(dir_ / "file") << "x";
  test::expect_error([&] { io::write_png(dir_ / "file" / "x.png", rgb.data(), 2, 2); },
                     {"[png] cannot write", "Not a directory"});
  // The target is a folder: the image is encoded, then the rename fails and the
  // temporary file must be removed.
  fs::create_directory(dir_ / "taken.png");
  test::expect_error([&] { io::write_png(dir_ / "taken.png", rgb.data(), 2, 2); },
                     {"[png] cannot write " + (dir_ / "taken.png").string() + ": "});
  EXPECT_TRUE(fs::is_directory(dir_ / "taken.png"));
  EXPECT_EQ(listing(), (std::vector<std::string>{"file", "taken.png"}));
}

TEST_F(Png, BadArgumentsAreRejectedBeforeWriting) {
  const auto rgb = pattern(2, 2);
  const fs::path path = dir_ / "x.png";
  test::expect_error([&] { io::write_png(path, rgb.data(), 0, 2); }, {"[png] cannot write", "image size 0x2"});
  test::expect_error([&] { io::write_png(path, rgb.data(), 2, 2, {{"", "v"}}); }, {"invalid text keyword"});
  test::expect_error([&] { io::write_png(path, rgb.data(), 2, 2, {{"bad\nkey", "v"}}); }, {"invalid text keyword"});
  test::expect_error([&] { io::write_png(path, rgb.data(), 2, 2, {{std::string(80, 'k'), "v"}}); },
                     {"invalid text keyword"});
  EXPECT_TRUE(listing().empty());
}

TEST_F(Png, ReadErrorsNameThePath) {
  test::expect_error([&] { io::read_png(dir_ / "absent.png"); }, {"[png] cannot read", "absent.png"});
  std::ofstream(dir_ / "junk.png") << "not a png at all";
  test::expect_error([&] { io::read_png(dir_ / "junk.png"); }, {"[png] cannot read", "bad signature"});
  // A truncated PNG: libpng's error becomes the reason.
  const auto rgb = pattern(16, 16);
  io::write_png(dir_ / "full.png", rgb.data(), 16, 16);
  fs::resize_file(dir_ / "full.png", fs::file_size(dir_ / "full.png") - 20);
  test::expect_error([&] { io::read_png(dir_ / "full.png"); }, {"[png] cannot read", "full.png"});
}

// The PNG chunk CRC (ISO 3309).
uint32_t png_crc(const std::string& bytes) {
  uint32_t c = 0xffffffffu;
  for (const char ch : bytes) {
    c ^= static_cast<unsigned char>(ch);
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return c ^ 0xffffffffu;
}

TEST_F(Png, TheDeclaredSizeIsCheckedBeforeThePixelsAreAllocated) {
  const auto rgb = pattern(64, 64);
  io::write_png(dir_ / "small.png", rgb.data(), 64, 64);
  // The same file with its header declaring 30000x30000 (its CRC redone): 2.7 GB of pixels.
  std::ifstream in(dir_ / "small.png", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.substr(12, 4), "IHDR");
  for (const size_t at : {size_t(16), size_t(20)})  // width, height: big-endian
    for (int i = 0; i < 4; ++i) bytes[at + size_t(i)] = char((30000u >> (24 - 8 * i)) & 0xff);
  const uint32_t crc = png_crc(bytes.substr(12, 4 + 13));
  for (int i = 0; i < 4; ++i) bytes[29 + size_t(i)] = char((crc >> (24 - 8 * i)) & 0xff);
  std::ofstream(dir_ / "declares_30000.png", std::ios::binary) << bytes;
  test::expect_error([&] { io::read_png(dir_ / "declares_30000.png"); },
                     {"[png] cannot read", "declares_30000.png", "it declares 30000x30000 pixels (HxW), 2.51 GiB",
                      "expected at most 268435456 pixels (16384x16384)"});
  // A caller's memory budget: 64x64 needs 12 KiB of RGB.
  test::expect_error([&] { io::read_png(dir_ / "small.png", 12287); },
                     {"it declares 64x64 pixels", "the memory available for it"});
  EXPECT_EQ(io::read_png(dir_ / "small.png", 12288).rgb, rgb);
}

}  // namespace
}  // namespace kiln
