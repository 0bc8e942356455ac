// Safetensors reader/writer: round trips, zero-copy loads, validation of malformed files,
// sharded checkpoints, slice reads for tensor parallelism, and a seeded mutation fuzz.
#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"
#include "safetensors_fuzzing.h"
#include "test_util.h"

namespace fs = std::filesystem;
using kiln::DType;
using kiln::Tensor;
using kiln::io::SafetensorsFile;
using kiln::io::SafetensorsIndex;

namespace {

using kiln::test::expect_error;
using kiln::test::make_tensor;

// A fresh folder per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ =
        fs::temp_directory_path() / ("kiln_st_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    kiln::io::reset_bytes_read();
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
};


std::vector<float> iota_f32(size_t n, float scale = 0.5f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(i) * scale - 3.0f;
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (float f : v) out.push_back(kiln::f32_to_bf16(f));
  return out;
}

std::vector<float> as_f32(const Tensor& t) {
  std::vector<float> out(size_t(t.numel()));
  kiln::convert_to_f32(t.data_ptr(), t.dtype(), out.data(), t.numel());
  return out;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

bool in_mapping(const SafetensorsFile& f, const Tensor& t) {
  const auto range = f.mapped_range();
  const auto* p = static_cast<const std::byte*>(t.data_ptr());
  return p >= range.data() && p + t.nbytes() <= range.data() + range.size();
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char((v >> (8 * i)) & 0xff);
  return s;
}

// A hand-made file: header length, header text, then `data_bytes` bytes of data.
fs::path write_raw(const fs::path& path, const std::string& header, size_t data_bytes) {
  write_bytes(path, le64(header.size()) + header + std::string(data_bytes, '\x01'));
  return path;
}

// ---- round trip and zero-copy ---------------------------------------------------------------

TEST_F(SafetensorsTest, RoundTripEveryDtype) {
  const std::vector<float> f = iota_f32(6);
  std::vector<uint16_t> f16;
  for (float x : f) f16.push_back(kiln::f32_to_f16(x));
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"a.f32", make_tensor<float>({2, 3}, DType::f32, f)},
      {"b.bf16", make_tensor<uint16_t>({3, 2}, DType::bf16, to_bf16(f))},
      {"c.f16", make_tensor<uint16_t>({6}, DType::f16, f16)},
      {"d.i32", make_tensor<int32_t>({2, 2}, DType::i32, {1, -2, 3, 2147483647})},
      {"e.i64", make_tensor<int64_t>({3}, DType::i64, {-1, 1LL << 40, 7})},
      {"f.bool", make_tensor<uint8_t>({5}, DType::boolean, {1, 0, 0, 1, 1})},
      {"g.empty", make_tensor<float>({0, 4}, DType::f32, {})},
  };
  const fs::path path = dir_ / "model.safetensors";
  kiln::io::save_safetensors(path, tensors, {{"format", "pt"}, {"note", "kiln test"}});

  const SafetensorsFile file(path);
  EXPECT_EQ(file.names(), (std::vector<std::string>{"a.f32", "b.bf16", "c.f16", "d.i32", "e.i64",
                                                    "f.bool", "g.empty"}));
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at("note"), "kiln test");
  for (const auto& [name, expected] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(file.contains(name));
    const kiln::io::TensorInfo& info = file.info(name);
    EXPECT_EQ(info.dtype_string, kiln::io::safetensors_dtype_name(expected.dtype()));
    EXPECT_EQ(info.dtype, expected.dtype());
    EXPECT_EQ(info.shape, expected.shape());
    EXPECT_EQ(info.nbytes(), expected.nbytes());
    const Tensor t = file.load(name);
    EXPECT_EQ(t.dtype(), expected.dtype());
    EXPECT_EQ(t.shape(), expected.shape());
    EXPECT_EQ(t.device(), kiln::Device::cpu());
    EXPECT_TRUE(same_bytes(t, expected));
    if (t.nbytes() > 0) {
      EXPECT_TRUE(in_mapping(file, t)) << "load() should be zero-copy";
    }
  }
  EXPECT_FALSE(file.contains("missing"));
}

TEST_F(SafetensorsTest, DataSectionIsEightByteAlignedAndContiguous) {
  const fs::path path = dir_ / "m.safetensors";
  kiln::io::save_safetensors(path, {{"x", make_tensor<float>({3}, DType::f32, iota_f32(3))},
                                    {"y", make_tensor<uint8_t>({1}, DType::boolean, {1})},
                                    {"z", make_tensor<float>({2}, DType::f32, iota_f32(2))}});
  const std::string raw = read_bytes(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(raw[size_t(i)])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw.size(), 8 + n + 12 + 1 + 8);
  const SafetensorsFile file(path);
  EXPECT_EQ(file.info("x").byte_begin, 8 + n);  // data in the given order, no gaps
  EXPECT_EQ(file.info("y").byte_begin, 8 + n + 12);
  EXPECT_EQ(file.info("z").byte_begin, 8 + n + 13);
  // z sits at an odd address: it must come back correct (and therefore copied).
  const Tensor z = file.load("z");
  EXPECT_EQ(as_f32(z), iota_f32(2));
  EXPECT_FALSE(in_mapping(file, z));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(z.data_ptr()) % 4, 0u);
}

TEST_F(SafetensorsTest, ZeroCopyTensorOutlivesTheFileObject) {
  const fs::path path = dir_ / "m.safetensors";
  kiln::io::save_safetensors(path, {{"w", make_tensor<float>({4, 4}, DType::f32, iota_f32(16))}});
  Tensor t;
  {
    const SafetensorsFile file(path);
    t = file.load("w");
    ASSERT_TRUE(in_mapping(file, t));
  }
  EXPECT_EQ(as_f32(t), iota_f32(16));  // the buffer keeps the mapping alive
}

TEST_F(SafetensorsTest, LoadConvertsToTheWantedDtype) {
  const fs::path path = dir_ / "m.safetensors";
  const std::vector<float> f = iota_f32(6);
  kiln::io::save_safetensors(path, {{"bf", make_tensor<uint16_t>({2, 3}, DType::bf16, to_bf16(f))},
                                    {"f", make_tensor<float>({6}, DType::f32, f)},
                                    {"i", make_tensor<int64_t>({2}, DType::i64, {5, -9})}});
  const SafetensorsFile file(path);

  const Tensor bf_as_f32 = file.load("bf", DType::f32);
  EXPECT_EQ(bf_as_f32.dtype(), DType::f32);
  EXPECT_EQ(bf_as_f32.shape(), (kiln::Shape{2, 3}));
  EXPECT_FALSE(in_mapping(file, bf_as_f32));
  for (size_t i = 0; i < f.size(); ++i)
    EXPECT_EQ(as_f32(bf_as_f32)[i], kiln::bf16_to_f32(kiln::f32_to_bf16(f[i])));

  const Tensor f_as_bf16 = file.load("f", DType::bf16);
  EXPECT_EQ(f_as_bf16.dtype(), DType::bf16);
  EXPECT_EQ(std::memcmp(f_as_bf16.data_ptr(), to_bf16(f).data(), 12), 0);

  const Tensor i_as_i32 = file.load("i", DType::i32);
  EXPECT_EQ(static_cast<const int32_t*>(i_as_i32.data_ptr())[1], -9);

  EXPECT_TRUE(in_mapping(file, file.load("f", DType::f32)));  // same dtype stays zero-copy
}

TEST_F(SafetensorsTest, BytesReadCountsFullLoads) {
  const fs::path path = dir_ / "m.safetensors";
  kiln::io::save_safetensors(
      path, {{"a", make_tensor<float>({8}, DType::f32, iota_f32(8))},
             {"b", make_tensor<uint16_t>({4}, DType::bf16, to_bf16(iota_f32(4)))}});
  const SafetensorsFile file(path);
  EXPECT_EQ(kiln::io::bytes_read(), 0u);
  file.load("a");
  EXPECT_EQ(kiln::io::bytes_read(), 32u);
  file.load("b", DType::f32);  // counts the stored bytes, not the converted ones
  EXPECT_EQ(kiln::io::bytes_read(), 40u);
  kiln::io::reset_bytes_read();
  EXPECT_EQ(kiln::io::bytes_read(), 0u);
}

TEST_F(SafetensorsTest, UnsupportedDtypeOpensButDoesNotLoad) {
  const fs::path path = write_raw(dir_ / "f64.safetensors",
                                  R"({"d":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},)"
                                  R"("u":{"dtype":"U8","shape":[3],"data_offsets":[16,19]}})",
                                  19);
  const SafetensorsFile file(path);
  EXPECT_EQ(file.info("d").dtype_string, "F64");
  EXPECT_FALSE(file.info("d").dtype.has_value());
  expect_error([&] { file.load("d"); },
               {"[safetensors]", "f64.safetensors", "'d'", "F64", "not supported by kiln"});
  expect_error([&] { file.load("u", DType::f32); }, {"'u'", "U8", "not supported by kiln"});
  expect_error([&] { file.load_slice("d", 0, 0, 1, DType::f32); }, {"'d'", "not supported"});
}

TEST_F(SafetensorsTest, MissingTensorNamesFileAndTensor) {
  const fs::path path = dir_ / "m.safetensors";
  kiln::io::save_safetensors(path, {{"a", make_tensor<float>({1}, DType::f32, {1.0f})}});
  const SafetensorsFile file(path);
  expect_error([&] { file.load("nope"); }, {"m.safetensors", "no tensor 'nope'"});
  expect_error([&] { file.info("nope"); }, {"m.safetensors", "'nope'"});
}

TEST_F(SafetensorsTest, MissingFileIsAnError) {
  expect_error([&] { SafetensorsFile f(dir_ / "absent.safetensors"); },
               {"absent.safetensors", "cannot open"});
  expect_error([&] { SafetensorsFile f(dir_); }, {"not a regular file"});
}

// ---- malformed files -----------------------------------------------------------------------

TEST_F(SafetensorsTest, FileShorterThanEightBytes) {
  write_bytes(dir_ / "short.safetensors", "abc");
  expect_error([&] { SafetensorsFile f(dir_ / "short.safetensors"); },
               {"short.safetensors", "truncated", "3 bytes"});
  write_bytes(dir_ / "empty.safetensors", "");
  expect_error([&] { SafetensorsFile f(dir_ / "empty.safetensors"); },
               {"empty.safetensors", "truncated"});
}

TEST_F(SafetensorsTest, DataCutShort) {
  const fs::path path = dir_ / "cut.safetensors";
  kiln::io::save_safetensors(path, {{"w", make_tensor<float>({2, 3}, DType::f32, iota_f32(6))}});
  fs::resize_file(path, fs::file_size(path) - 5);
  expect_error([&] { SafetensorsFile f(path); },
               {"cut.safetensors", "tensor 'w'", "outside the file", "19 bytes", "truncated"});
}

TEST_F(SafetensorsTest, HeaderLengthPastEndOfFile) {
  write_bytes(dir_ / "h.safetensors", le64(1000) + "{}");
  expect_error([&] { SafetensorsFile f(dir_ / "h.safetensors"); },
               {"h.safetensors", "header length 1000", "past the end of the file"});
}

TEST_F(SafetensorsTest, AbsurdHeaderSize) {
  write_bytes(dir_ / "huge.safetensors", le64(uint64_t(1) << 40) + "{}");
  expect_error([&] { SafetensorsFile f(dir_ / "huge.safetensors"); },
               {"huge.safetensors", "absurd"});
  write_bytes(dir_ / "max.safetensors", le64(~uint64_t(0)) + "{}");
  expect_error([&] { SafetensorsFile f(dir_ / "max.safetensors"); }, {"absurd"});
}

TEST_F(SafetensorsTest, HeaderIsNotJson) {
  write_raw(dir_ / "bad.safetensors", R"({"w": {"dtype": "F32", )", 0);
  expect_error([&] { SafetensorsFile f(dir_ / "bad.safetensors"); },
               {"bad.safetensors", "bad JSON", "column"});
  write_raw(dir_ / "zero.safetensors", "", 0);
  expect_error([&] { SafetensorsFile f(dir_ / "zero.safetensors"); }, {"bad JSON"});
}

TEST_F(SafetensorsTest, HeaderIsNotAnObject) {
  write_raw(dir_ / "arr.safetensors", "[1, 2, 3]", 0);
  expect_error([&] { SafetensorsFile f(dir_ / "arr.safetensors"); },
               {"arr.safetensors", "header is an array", "expected a JSON object"});
}

TEST_F(SafetensorsTest, UnknownDtype) {
  write_raw(dir_ / "dt.safetensors", R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})",
            16);
  expect_error([&] { SafetensorsFile f(dir_ / "dt.safetensors"); },
               {"dt.safetensors", "tensor 'w'", "unknown dtype 'F128'", "F8_E5M2"});
  write_raw(dir_ / "num.safetensors", R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4);
  expect_error([&] { SafetensorsFile f(dir_ / "num.safetensors"); },
               {"tensor 'w'", "\"dtype\" is an integer, expected a string"});
}

TEST_F(SafetensorsTest, RangeOutsideFile) {
  write_raw(dir_ / "r.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
            16);
  expect_error([&] { SafetensorsFile f(dir_ / "r.safetensors"); },
               {"r.safetensors", "tensor 'w'", "[8,24]", "outside the file", "16 bytes"});
}

TEST_F(SafetensorsTest, OverlappingRanges) {
  write_raw(dir_ / "o.safetensors",
            R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
            20);
  expect_error([&] { SafetensorsFile f(dir_ / "o.safetensors"); },
               {"o.safetensors", "'a'", "'b'", "overlap"});
}

TEST_F(SafetensorsTest, EmptyTensorsDoNotOverlap) {
  write_raw(dir_ / "e.safetensors",
            R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
            R"("b":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})",
            16);
  const SafetensorsFile f(dir_ / "e.safetensors");
  EXPECT_EQ(f.load("b").numel(), 0);
}

TEST_F(SafetensorsTest, ShapeSizeMismatch) {
  write_raw(dir_ / "model.safetensors",
            R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 20);
  expect_error([&] { SafetensorsFile f(dir_ / "model.safetensors"); },
               {"[safetensors] ",
                "model.safetensors: tensor 'w': shape [2,3] x F32 needs 24 "
                "bytes but data_offsets span 20"});
}

TEST_F(SafetensorsTest, ShapeElementCountOverflow) {
  write_raw(dir_ / "ov.safetensors",
            R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})", 0);
  expect_error([&] { SafetensorsFile f(dir_ / "ov.safetensors"); },
               {"ov.safetensors", "tensor 'w'", "too large"});
}

TEST_F(SafetensorsTest, BadShapeEntries) {
  write_raw(dir_ / "neg.safetensors",
            R"({"w":{"dtype":"F32","shape":[2,-3],"data_offsets":[0,24]}})", 24);
  expect_error([&] { SafetensorsFile f(dir_ / "neg.safetensors"); },
               {"neg.safetensors", "tensor 'w'", "shape entry 1", "negative"});
  write_raw(dir_ / "frac.safetensors",
            R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8);
  expect_error([&] { SafetensorsFile f(dir_ / "frac.safetensors"); },
               {"frac.safetensors", "tensor 'w'", "shape entry 0", "a float",
                "expected a non-negative integer"});
  write_raw(dir_ / "str.safetensors", R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})",
            8);
  expect_error([&] { SafetensorsFile f(dir_ / "str.safetensors"); },
               {"tensor 'w'", "\"shape\" is a string"});
}

TEST_F(SafetensorsTest, BeginAfterEnd) {
  write_raw(dir_ / "be.safetensors", R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})", 8);
  expect_error([&] { SafetensorsFile f(dir_ / "be.safetensors"); },
               {"be.safetensors", "tensor 'w'", "begin 8 > end 4"});
}

TEST_F(SafetensorsTest, MalformedEntries) {
  write_raw(dir_ / "m1.safetensors", R"({"w":{"dtype":"F32","shape":[1]}})", 4);
  expect_error([&] { SafetensorsFile f(dir_ / "m1.safetensors"); },
               {"tensor 'w'", "missing \"data_offsets\""});
  write_raw(dir_ / "m2.safetensors", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4);
  expect_error([&] { SafetensorsFile f(dir_ / "m2.safetensors"); },
               {"tensor 'w'", "expected [begin, end]"});
  write_raw(dir_ / "m3.safetensors", R"({"w":[1,2]})", 0);
  expect_error([&] { SafetensorsFile f(dir_ / "m3.safetensors"); },
               {"tensor 'w'", "entry is an array"});
  write_raw(dir_ / "m4.safetensors", R"({"__metadata__":{"k":1}})", 0);
  expect_error([&] { SafetensorsFile f(dir_ / "m4.safetensors"); },
               {"m4.safetensors", "__metadata__", "'k'", "expected a string"});
}

// ---- slices ---------------------------------------------------------------------------------

class SliceTest : public SafetensorsTest {
 protected:
  void SetUp() override {
    SafetensorsTest::SetUp();
    path_ = dir_ / "w.safetensors";
    kiln::io::save_safetensors(path_,
                               {{"w", make_tensor<float>({6, 5}, DType::f32, full_)},
                                {"wb", make_tensor<uint16_t>({6, 5}, DType::bf16, to_bf16(full_))},
                                {"v", make_tensor<float>({5}, DType::f32, iota_f32(5))}});
    kiln::io::reset_bytes_read();
  }
  // Element (r, c) of the 6x5 test matrix as stored in dtype `t`.
  float at(int64_t r, int64_t c, DType t) const {
    const float v = full_[size_t(r * 5 + c)];
    return t == DType::bf16 ? kiln::bf16_to_f32(kiln::f32_to_bf16(v)) : v;
  }
  void expect_slice(const Tensor& s, int dim, int64_t start, DType stored) const {
    const std::vector<float> got = as_f32(s);
    for (int64_t r = 0; r < s.shape()[0]; ++r)
      for (int64_t c = 0; c < s.shape()[1]; ++c)
        EXPECT_EQ(got[size_t(r * s.shape()[1] + c)],
                  at(dim == 0 ? r + start : r, dim == 1 ? c + start : c, stored))
            << "at " << r << "," << c;
  }

  const std::vector<float> full_ = iota_f32(30, 0.25f);
  fs::path path_;
};

TEST_F(SliceTest, RowsMatchTheFullTensor) {
  const SafetensorsFile file(path_);
  const Tensor s = file.load_slice("w", 0, 2, 3, DType::f32);
  EXPECT_EQ(s.shape(), (kiln::Shape{3, 5}));
  EXPECT_EQ(s.dtype(), DType::f32);
  expect_slice(s, 0, 2, DType::f32);
  EXPECT_EQ(kiln::io::bytes_read(), 3u * 5 * 4);
}

TEST_F(SliceTest, ColumnsMatchTheFullTensor) {
  const SafetensorsFile file(path_);
  const Tensor s = file.load_slice("w", 1, 1, 3, DType::f32);
  EXPECT_EQ(s.shape(), (kiln::Shape{6, 3}));
  expect_slice(s, 1, 1, DType::f32);
  EXPECT_EQ(kiln::io::bytes_read(), 6u * 3 * 4);
}

TEST_F(SliceTest, Bf16SlicesConvertToF32) {
  const SafetensorsFile file(path_);
  const Tensor rows = file.load_slice("wb", 0, 4, 2, DType::f32);
  EXPECT_EQ(rows.dtype(), DType::f32);
  expect_slice(rows, 0, 4, DType::bf16);
  EXPECT_EQ(kiln::io::bytes_read(), 2u * 5 * 2);  // the stored bf16 bytes
  const Tensor cols = file.load_slice("wb", 1, 3, 2, DType::f32);
  expect_slice(cols, 1, 3, DType::bf16);
  EXPECT_EQ(kiln::io::bytes_read(), 2u * 5 * 2 + 6u * 2 * 2);
  const Tensor same = file.load_slice("wb", 1, 0, 5, DType::bf16);
  EXPECT_EQ(same.dtype(), DType::bf16);
  EXPECT_TRUE(same_bytes(same, file.load("wb")));
}

TEST_F(SliceTest, EmptyAndFullSlices) {
  const SafetensorsFile file(path_);
  EXPECT_EQ(file.load_slice("w", 0, 6, 0, DType::f32).numel(), 0);
  EXPECT_EQ(file.load_slice("w", 1, 0, 0, DType::f32).numel(), 0);
  EXPECT_EQ(kiln::io::bytes_read(), 0u);
  EXPECT_TRUE(same_bytes(file.load_slice("w", 0, 0, 6, DType::f32), file.load("w")));
}

TEST_F(SliceTest, OutOfRangeSlicesAreErrors) {
  const SafetensorsFile file(path_);
  expect_error([&] { file.load_slice("w", 0, 4, 3, DType::f32); },
               {"w.safetensors", "tensor 'w'", "[4, 7)", "dim 0", "size 6"});
  expect_error([&] { file.load_slice("w", 1, -1, 2, DType::f32); },
               {"tensor 'w'", "[-1, 1)", "dim 1", "size 5"});
  expect_error([&] { file.load_slice("w", 1, 2, INT64_MAX, DType::f32); },
               {"tensor 'w'", "dim 1", "size 5"});
  expect_error([&] { file.load_slice("w", 2, 0, 1, DType::f32); }, {"tensor 'w'", "dim 2"});
  expect_error([&] { file.load_slice("v", 1, 0, 1, DType::f32); }, {"tensor 'v'", "[5]", "2-D"});
  EXPECT_EQ(kiln::io::bytes_read(), 0u);
}

// A 1-D tensor (a bias) is sliced by rows: a colwise shard's bias.
TEST_F(SliceTest, RowsOfAVector) {
  const SafetensorsFile file(path_);
  const kiln::Tensor all = file.load("v"), part = file.load_slice("v", 0, 1, 3, kiln::DType::f32);
  EXPECT_EQ(part.shape(), kiln::Shape({3}));
  const std::vector<float> a = kiln::to_vector(all), p = kiln::to_vector(part);
  EXPECT_EQ(p, (std::vector<float>{a[1], a[2], a[3]}));
}

// ---- sharded checkpoints --------------------------------------------------------------------

class IndexTest : public SafetensorsTest {
 protected:
  void SetUp() override {
    SafetensorsTest::SetUp();
    kiln::io::save_safetensors(dir_ / "model-00001-of-00002.safetensors",
                               {{"a", make_tensor<float>({2, 2}, DType::f32, iota_f32(4))}});
    kiln::io::save_safetensors(
        dir_ / "model-00002-of-00002.safetensors",
        {{"b", make_tensor<uint16_t>({2, 3}, DType::bf16, to_bf16(iota_f32(6)))}});
  }
  fs::path write_index(const std::string& name, const std::string& weight_map) const {
    const fs::path p = dir_ / name;
    write_bytes(p,
                R"({"metadata":{"total_size":28,"format":"pt"},"weight_map":)" + weight_map + "}");
    return p;
  }
  const std::string good_map_ =
      R"({"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"})";
};

TEST_F(IndexTest, LoadsFromBothShards) {
  const SafetensorsIndex index(write_index("model.safetensors.index.json", good_map_));
  EXPECT_EQ(index.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(index.contains("b"));
  EXPECT_FALSE(index.contains("c"));
  EXPECT_EQ(index.metadata().at("total_size"), "28");
  EXPECT_EQ(index.metadata().at("format"), "pt");
  EXPECT_EQ(as_f32(index.load("a")), iota_f32(4));
  const Tensor b = index.load("b", DType::f32);
  EXPECT_EQ(b.shape(), (kiln::Shape{2, 3}));
  EXPECT_EQ(as_f32(b)[5], kiln::bf16_to_f32(kiln::f32_to_bf16(iota_f32(6)[5])));
  EXPECT_EQ(index.info("b").dtype_string, "BF16");
  EXPECT_EQ(index.shard_path("b").filename(), "model-00002-of-00002.safetensors");
  const Tensor col = index.load_slice("b", 1, 2, 1, DType::f32);
  EXPECT_EQ(col.shape(), (kiln::Shape{2, 1}));
  EXPECT_EQ(as_f32(col)[1], as_f32(b)[5]);
}

TEST_F(IndexTest, OpensAFolder) {
  write_index("diffusion_pytorch_model.safetensors.index.json", good_map_);
  const SafetensorsIndex index(dir_);
  EXPECT_EQ(index.path().filename(), "diffusion_pytorch_model.safetensors.index.json");
  EXPECT_EQ(as_f32(index.load("a")), iota_f32(4));
}

TEST_F(IndexTest, OpensASingleFileAndAFolderWithOneFile) {
  const SafetensorsIndex file(dir_ / "model-00001-of-00002.safetensors");
  EXPECT_EQ(file.names(), std::vector<std::string>{"a"});
  EXPECT_EQ(as_f32(file.load("a")), iota_f32(4));
  expect_error([&] { file.load("b"); }, {"model-00001-of-00002.safetensors", "'b'"});

  const fs::path one = dir_ / "one";
  fs::create_directories(one);
  fs::copy_file(dir_ / "model-00002-of-00002.safetensors", one / "weights.safetensors");
  const SafetensorsIndex folder(one);
  EXPECT_EQ(folder.path().filename(), "weights.safetensors");
  EXPECT_TRUE(folder.contains("b"));

  expect_error([&] { SafetensorsIndex i(dir_); }, {"2 .safetensors files", "no index.json"});
  const fs::path none = dir_ / "none";
  fs::create_directories(none);
  expect_error([&] { SafetensorsIndex i(none); }, {"none", "no checkpoint"});
}

TEST_F(IndexTest, MissingTensorNamesIndexAndTensor) {
  const SafetensorsIndex index(write_index("model.safetensors.index.json", good_map_));
  expect_error([&] { index.load("c"); },
               {"model.safetensors.index.json", "tensor 'c'", "not in the weight_map"});
}

TEST_F(IndexTest, ShardLackingTheTensor) {
  const SafetensorsIndex index(write_index(
      "model.safetensors.index.json",
      R"({"a":"model-00002-of-00002.safetensors","b":"model-00002-of-00002.safetensors"})"));
  expect_error([&] { index.load("a"); }, {"model.safetensors.index.json", "'a'",
                                          "model-00002-of-00002.safetensors", "no such tensor"});
}

TEST_F(IndexTest, MissingShardFile) {
  const SafetensorsIndex index(
      write_index("model.safetensors.index.json", R"({"a":"gone.safetensors"})"));
  expect_error([&] { index.load("a"); },
               {"gone.safetensors", "cannot open", "model.safetensors.index.json"});
}

TEST_F(IndexTest, ShardNamesMustStayInsideTheFolder) {
  const fs::path sub = dir_ / "sub";
  fs::create_directories(sub);
  write_bytes(sub / "model.safetensors.index.json",
              R"({"weight_map":{"a":"../model-00001-of-00002.safetensors"}})");
  expect_error([&] { SafetensorsIndex i(sub / "model.safetensors.index.json"); },
               {"model.safetensors.index.json", "'../model-00001-of-00002.safetensors'", ".."});

  const std::string abs = (dir_ / "model-00001-of-00002.safetensors").string();
  write_bytes(sub / "abs.safetensors.index.json", R"({"weight_map":{"a":")" + abs + R"("}})");
  expect_error([&] { SafetensorsIndex i(sub / "abs.safetensors.index.json"); },
               {"abs.safetensors.index.json", abs, "absolute"});

  write_bytes(sub / "empty.safetensors.index.json", R"({"weight_map":{"a":""}})");
  expect_error([&] { SafetensorsIndex i(sub / "empty.safetensors.index.json"); },
               {"empty.safetensors.index.json", "tensor 'a'", "''", "is empty"});

  // The rule is about names: a shard behind the user's own symlink out of the folder (as in a
  // Hugging Face hub cache, links into ../../blobs/) is opened through the link.
  fs::create_symlink(dir_ / "model-00001-of-00002.safetensors", sub / "link.safetensors");
  write_bytes(sub / "link.safetensors.index.json", R"({"weight_map":{"a":"link.safetensors"}})");
  const SafetensorsIndex linked(sub / "link.safetensors.index.json");
  EXPECT_EQ(as_f32(linked.load("a")), iota_f32(4));
  EXPECT_EQ(linked.shard_path("a"), sub / "link.safetensors");

  // A nested shard folder inside the model folder is fine.
  fs::create_directories(sub / "shards");
  fs::copy_file(dir_ / "model-00001-of-00002.safetensors", sub / "shards" / "s.safetensors");
  write_bytes(sub / "nested.safetensors.index.json",
              R"({"weight_map":{"a":"shards/s.safetensors"}})");
  EXPECT_EQ(as_f32(SafetensorsIndex(sub / "nested.safetensors.index.json").load("a")), iota_f32(4));
}

TEST_F(IndexTest, MalformedIndex) {
  write_bytes(dir_ / "bad.safetensors.index.json", "{\"weight_map\": {\n  \"a\": }");
  expect_error([&] { SafetensorsIndex i(dir_ / "bad.safetensors.index.json"); },
               {"bad.safetensors.index.json", "bad JSON", "line 2"});
  write_bytes(dir_ / "nomap.safetensors.index.json", R"({"metadata":{}})");
  expect_error([&] { SafetensorsIndex i(dir_ / "nomap.safetensors.index.json"); },
               {"nomap.safetensors.index.json", "weight_map"});
  write_bytes(dir_ / "num.safetensors.index.json", R"({"weight_map":{"a":3}})");
  expect_error([&] { SafetensorsIndex i(dir_ / "num.safetensors.index.json"); },
               {"num.safetensors.index.json", "'a'", "expected a shard file name"});
}

// ---- writer ---------------------------------------------------------------------------------

TEST_F(SafetensorsTest, WriterRejectsBadInputWithoutLeavingFiles) {
  const fs::path path = dir_ / "out.safetensors";
  const Tensor ok = make_tensor<float>({2, 3}, DType::f32, iota_f32(6));
  const Tensor transposed = Tensor::view_of(ok.buffer(), {3, 2}, DType::f32, {1, 3});
  expect_error(
      [&] {
        kiln::io::save_safetensors(path, {{"t", transposed}});
      },
      {"out.safetensors", "'t'", "not contiguous"});
  expect_error([&] { kiln::io::save_safetensors(path, {{"x", ok}, {"x", ok}}); }, {"'x'", "twice"});
  expect_error([&] { kiln::io::save_safetensors(path, {{"x", Tensor()}}); }, {"undefined"});
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 0);
}

TEST_F(SafetensorsTest, WriterReplacesAnExistingFile) {
  const fs::path path = dir_ / "out.safetensors";
  kiln::io::save_safetensors(path, {{"x", make_tensor<float>({1}, DType::f32, {1.0f})}});
  const SafetensorsFile old(path);
  const Tensor old_x = old.load("x");
  kiln::io::save_safetensors(path, {{"y", make_tensor<float>({2}, DType::f32, {2.0f, 3.0f})}});
  EXPECT_EQ(as_f32(old_x), std::vector<float>{1.0f});  // the old mapping is untouched
  const SafetensorsFile now(path);
  EXPECT_EQ(now.names(), std::vector<std::string>{"y"});
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

// ---- fuzz -----------------------------------------------------------------------------------

TEST_F(SafetensorsTest, MutatedFilesOnlyEverThrowKilnError) {
  const fs::path good = dir_ / "good.safetensors";
  kiln::io::save_safetensors(good,
                             {{"w", make_tensor<float>({3, 4}, DType::f32, iota_f32(12))},
                              {"b", make_tensor<uint16_t>({4}, DType::bf16, to_bf16(iota_f32(4)))},
                              {"i", make_tensor<int64_t>({2, 1}, DType::i64, {1, 2})},
                              {"m", make_tensor<uint8_t>({3}, DType::boolean, {1, 0, 1})}},
                             {{"format", "pt"}});
  const std::string valid = read_bytes(good);

  kiln::test::SplitMix64 rng{20240601};
  const fs::path path = dir_ / "fuzz.safetensors";
  int opened = 0, rejected = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string bytes = valid;
    kiln::test::mutate_once(bytes, kiln::test::read_le64(valid), rng);
    write_bytes(path, bytes);
    try {
      kiln::test::open_and_load_all(path);
      ++opened;
    } catch (const kiln::Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "case " << i << ": non-kiln exception: " << e.what();
    }
  }
  EXPECT_EQ(opened + rejected, 2000);
  EXPECT_GT(rejected, 0);
  EXPECT_GT(opened, 0);
}

}  // namespace
