// GGUF reader/writer: round trips through kiln's writer (every dtype, metadata of every value
// type, alignments 32 and 64, zero-copy loads, slices, bytes counted), files written by the
// `gguf` Python package read exactly (tests/fixtures/gguf), the WeightSource opened by
// nn::open_checkpoint, malformed files rejected with messages naming the file and tensor, and
// a seeded mutation fuzz.
#include "io/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/gguf_writer.h"
#include "io/safetensors.h"
#include "nn/weight_source.h"
#include "gguf_fuzzing.h"
#include "test_util.h"

namespace fs = std::filesystem;
using kiln::DType;
using kiln::Shape;
using kiln::Tensor;
using kiln::io::GgufArray;
using kiln::io::GgufFile;
using kiln::io::GgufMetadata;
using kiln::io::GgufType;
using kiln::io::GgufValue;
using kiln::io::GgufWriter;

namespace {

using kiln::test::block_tensor;
using kiln::test::expect_error;
using kiln::test::make_tensor;

class GgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("kiln_gguf_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    kiln::io::reset_bytes_read();
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
};

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<float> iota_f32(size_t n, float scale = 0.5f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(i) * scale - 3.0f;
  return v;
}

std::vector<float> as_f32(const Tensor& t) {
  std::vector<float> out(size_t(t.numel()));
  kiln::convert_to_f32(t.data_ptr(), t.dtype(), out.data(), t.numel());
  return out;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

bool in_mapping(const GgufFile& f, const Tensor& t) {
  const auto range = f.mapped_range();
  const auto* p = static_cast<const std::byte*>(t.data_ptr());
  return p >= range.data() && p + t.nbytes() <= range.data() + range.size();
}

std::vector<uint16_t> to_f16(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (float f : v) out.push_back(kiln::f32_to_f16(f));
  return out;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (float f : v) out.push_back(kiln::f32_to_bf16(f));
  return out;
}

// One tensor of every dtype GGUF holds, ranks 1 to 4.
std::vector<std::pair<std::string, Tensor>> every_dtype() {
  return {
      {"a.f32", make_tensor<float>({3, 4}, DType::f32, iota_f32(12))},
      {"b.f16", make_tensor<uint16_t>({5}, DType::f16, to_f16(iota_f32(5)))},
      {"c.bf16", make_tensor<uint16_t>({2, 2, 4}, DType::bf16, to_bf16(iota_f32(16)))},
      {"d.i32", make_tensor<int32_t>({3}, DType::i32, {1, -2, 2147483647})},
      {"e.i64", make_tensor<int64_t>({2, 1}, DType::i64, {-1, 1LL << 40})},
      {"f.q8_0", block_tensor({2, 64}, DType::q8_0, 1)},
      {"g.q4_0", block_tensor({3, 32}, DType::q4_0, 2)},
      {"h.q4_k", block_tensor({2, 256}, DType::q4_k, 3)},
      {"i.q5_k", block_tensor({1, 512}, DType::q5_k, 4)},
      {"j.conv", make_tensor<float>({2, 1, 3, 2}, DType::f32, iota_f32(12))},
  };
}

GgufArray array_of(GgufType type, std::vector<GgufValue> items) { return GgufArray{type, std::move(items)}; }

// Metadata of every value type, arrays (empty, of strings, of arrays) included.
GgufMetadata every_value_type() {
  return {
      {"general.architecture", GgufValue{std::string("flux")}},
      {"t.u8", GgufValue{uint8_t(255)}},
      {"t.i8", GgufValue{int8_t(-128)}},
      {"t.u16", GgufValue{uint16_t(65535)}},
      {"t.i16", GgufValue{int16_t(-32768)}},
      {"t.u32", GgufValue{uint32_t(4294967295u)}},
      {"t.i32", GgufValue{int32_t(-2147483647 - 1)}},
      {"t.f32", GgufValue{1.5e-7f}},
      {"t.bool", GgufValue{true}},
      {"t.string", GgufValue{std::string("ünïcode \x01 ✓")}},
      {"t.empty_string", GgufValue{std::string()}},
      {"t.u64", GgufValue{uint64_t(18446744073709551615ull)}},
      {"t.i64", GgufValue{int64_t(-9223372036854775807ll - 1)}},
      {"t.f64", GgufValue{-1.0 / 3.0}},
      {"t.array_u32", GgufValue{array_of(GgufType::u32, {GgufValue{uint32_t(1)}, GgufValue{uint32_t(7)}})}},
      {"t.array_f64", GgufValue{array_of(GgufType::f64, {GgufValue{0.25}})}},
      {"t.array_empty", GgufValue{array_of(GgufType::i16, {})}},
      {"t.array_bool", GgufValue{array_of(GgufType::boolean, {GgufValue{false}, GgufValue{true}})}},
      {"t.array_string",
       GgufValue{array_of(GgufType::string, {GgufValue{std::string("a")}, GgufValue{std::string("")}})}},
      {"t.array_of_arrays",
       GgufValue{array_of(GgufType::array,
                          {GgufValue{array_of(GgufType::i8, {GgufValue{int8_t(-1)}})},
                           GgufValue{array_of(GgufType::string, {GgufValue{std::string("x")}})},
                           GgufValue{array_of(GgufType::array, {GgufValue{array_of(GgufType::u8, {})}})}})}},
  };
}

// ---- round trip through kiln's writer ------------------------------------------------------

TEST_F(GgufTest, RoundTripEveryDtypeAndValueTypeAtAlignments32And64) {
  for (uint32_t alignment : {32u, 64u}) {
    SCOPED_TRACE(alignment);
    const auto tensors = every_dtype();
    const GgufMetadata metadata = every_value_type();
    const fs::path path = dir_ / ("model" + std::to_string(alignment) + ".gguf");
    const uint64_t size = kiln::io::write_gguf(path, metadata, tensors, alignment);
    EXPECT_EQ(size, fs::file_size(path));

    const GgufFile file(path);
    EXPECT_EQ(file.version(), 3u);
    EXPECT_EQ(file.alignment(), alignment);
    EXPECT_EQ(file.data_offset() % alignment, 0u);
    GgufMetadata want = metadata;
    if (alignment != 32) want.emplace("general.alignment", GgufValue{alignment});
    EXPECT_EQ(file.metadata(), want);
    EXPECT_EQ(file.find_metadata("general.alignment") != nullptr, alignment != 32);
    std::vector<std::string> names;
    for (const auto& [name, t] : tensors) names.push_back(name);
    EXPECT_EQ(file.names(), names);  // file order

    uint64_t previous_end = file.data_offset();
    for (const auto& [name, expected] : tensors) {
      SCOPED_TRACE(name);
      const kiln::io::GgufTensorInfo& info = file.info(name);
      EXPECT_EQ(info.dtype, expected.dtype());
      EXPECT_EQ(info.ggml_type, *kiln::io::ggml_type_of(expected.dtype()));
      EXPECT_EQ(info.shape, expected.shape());
      EXPECT_EQ(info.nbytes(), expected.nbytes());
      EXPECT_EQ(info.byte_begin % alignment, 0u);
      EXPECT_EQ(info.byte_begin, (previous_end + alignment - 1) / alignment * alignment);  // in order, padded
      previous_end = info.byte_end;
      const Tensor t = file.load(name);
      EXPECT_EQ(t.dtype(), expected.dtype());
      EXPECT_EQ(t.shape(), expected.shape());
      EXPECT_EQ(t.device(), kiln::Device::cpu());
      EXPECT_TRUE(same_bytes(t, expected));
      EXPECT_TRUE(in_mapping(file, t)) << "load() should be zero-copy";
    }
    EXPECT_EQ(size, (previous_end + alignment - 1) / alignment * alignment);  // the last tensor padded too
  }
}

TEST_F(GgufTest, TypeIdsAreGgmls) {
  using kiln::io::dtype_of_ggml_type;
  using kiln::io::ggml_type_of;
  const std::pair<uint32_t, DType> ids[] = {{0, DType::f32},   {1, DType::f16},   {2, DType::q4_0},
                                            {8, DType::q8_0},  {12, DType::q4_k}, {13, DType::q5_k},
                                            {26, DType::i32},  {27, DType::i64},  {30, DType::bf16}};
  for (const auto& [id, dt] : ids) {
    EXPECT_EQ(dtype_of_ggml_type(id), dt) << id;
    EXPECT_EQ(ggml_type_of(dt), id) << kiln::dtype_name(dt);
  }
  EXPECT_STREQ(kiln::io::ggml_type_name(7), "Q5_1");
  EXPECT_STREQ(kiln::io::ggml_type_name(14), "Q6_K");
  EXPECT_STREQ(kiln::io::ggml_type_name(30), "BF16");
  EXPECT_STREQ(kiln::io::ggml_type_name(999), "?");
  EXPECT_FALSE(dtype_of_ggml_type(7));
  EXPECT_FALSE(ggml_type_of(DType::boolean));
  EXPECT_FALSE(ggml_type_of(DType::f8_e4m3));
}

TEST_F(GgufTest, ZeroCopyTensorOutlivesTheFileObject) {
  const fs::path path = dir_ / "m.gguf";
  kiln::io::write_gguf(path, {}, {{"w", make_tensor<float>({4, 4}, DType::f32, iota_f32(16))}});
  Tensor t;
  {
    const GgufFile file(path);
    t = file.load("w");
    ASSERT_TRUE(in_mapping(file, t));
    EXPECT_TRUE(t.buffer()->maps_file());
  }
  EXPECT_EQ(as_f32(t), iota_f32(16));  // the buffer keeps the mapping alive
}

TEST_F(GgufTest, LoadConvertsToTheWantedDtype) {
  const fs::path path = dir_ / "m.gguf";
  const std::vector<float> f = iota_f32(6);
  kiln::io::write_gguf(path, {},
                       {{"h", make_tensor<uint16_t>({2, 3}, DType::f16, to_f16(f))},
                        {"f", make_tensor<float>({6}, DType::f32, f)},
                        {"i", make_tensor<int32_t>({2}, DType::i32, {5, -9})}});
  const GgufFile file(path);
  const Tensor h = file.load("h", DType::f32);
  EXPECT_EQ(h.dtype(), DType::f32);
  EXPECT_EQ(h.shape(), (Shape{2, 3}));
  EXPECT_FALSE(in_mapping(file, h));
  EXPECT_EQ(as_f32(h), f);  // these values are exact in f16
  const Tensor bf = file.load("f", DType::bf16);
  EXPECT_EQ(std::memcmp(bf.data_ptr(), to_bf16(f).data(), 12), 0);
  const Tensor i = file.load("i", DType::i64);
  EXPECT_EQ(static_cast<const int64_t*>(i.data_ptr())[1], -9);
  EXPECT_TRUE(in_mapping(file, file.load("f", DType::f32)));  // same dtype stays zero-copy
}

TEST_F(GgufTest, SlicesReadRowsAndBlockAlignedColumns) {
  const fs::path path = dir_ / "m.gguf";
  const Tensor q = block_tensor({3, 64}, DType::q8_0, 9);  // rows of 2 blocks of 34 bytes
  const Tensor v = block_tensor({96}, DType::q4_0, 10);    // 3 blocks of 18 bytes
  kiln::io::write_gguf(path, {},
                       {{"w", make_tensor<float>({4, 6}, DType::f32, iota_f32(24))}, {"q", q}, {"v", v}});
  const GgufFile file(path);
  const std::vector<float> w = iota_f32(24);

  kiln::io::reset_bytes_read();
  const Tensor rows = file.load_slice("w", 0, 1, 2, DType::f32);
  EXPECT_EQ(rows.shape(), (Shape{2, 6}));
  EXPECT_EQ(as_f32(rows), std::vector<float>(w.begin() + 6, w.begin() + 18));
  EXPECT_EQ(kiln::io::bytes_read(), 48u);  // exactly the slice's bytes
  const Tensor cols = file.load_slice("w", 1, 2, 3, DType::f32);
  EXPECT_EQ(cols.shape(), (Shape{4, 3}));
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(as_f32(cols)[size_t(r * 3 + c)], w[size_t(r * 6 + 2 + c)]);
  EXPECT_EQ(kiln::io::bytes_read(), 48u + 48u);

  const auto* qb = static_cast<const char*>(q.data_ptr());
  const Tensor qrow = file.load_slice("q", 0, 2, 1, DType::q8_0);
  EXPECT_EQ(qrow.shape(), (Shape{1, 64}));
  EXPECT_EQ(std::memcmp(qrow.data_ptr(), qb + 2 * 68, 68), 0);
  const Tensor qcol = file.load_slice("q", 1, 32, 32, DType::q8_0);  // the second block of each row
  EXPECT_EQ(qcol.shape(), (Shape{3, 32}));
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(std::memcmp(static_cast<const char*>(qcol.data_ptr()) + r * 34, qb + r * 68 + 34, 34), 0);
  const Tensor vpart = file.load_slice("v", 0, 32, 64, DType::q4_0);
  EXPECT_EQ(vpart.shape(), (Shape{64}));
  EXPECT_EQ(std::memcmp(vpart.data_ptr(), static_cast<const char*>(v.data_ptr()) + 18, 36), 0);
  EXPECT_EQ(kiln::io::bytes_read(), 96u + 68u + 3 * 34u + 36u);

  expect_error([&] { file.load_slice("q", 1, 3, 10, DType::q8_0); },
               {"[gguf]", "m.gguf", "tensor 'q'", "q8_0", "32-element blocks", "[3, 13)", "block boundary"});
  expect_error([&] { file.load_slice("v", 0, 0, 40, DType::q4_0); }, {"tensor 'v'", "block boundary"});
  expect_error([&] { file.load_slice("w", 0, 3, 2, DType::f32); }, {"tensor 'w'", "[3, 5)", "out of range"});
  expect_error([&] { file.load_slice("w", 2, 0, 1, DType::f32); }, {"tensor 'w'", "dim 2"});
  expect_error([&] { file.load("missing"); }, {"m.gguf", "no tensor 'missing'"});
}

TEST_F(GgufTest, BytesReadCountsFullLoads) {
  const fs::path path = dir_ / "m.gguf";
  kiln::io::write_gguf(path, {},
                       {{"a", make_tensor<float>({8}, DType::f32, iota_f32(8))},
                        {"q", block_tensor({1, 256}, DType::q4_k, 5)}});
  const GgufFile file(path);
  EXPECT_EQ(kiln::io::bytes_read(), 0u);
  file.load("a");
  EXPECT_EQ(kiln::io::bytes_read(), 32u);
  file.load("q");
  EXPECT_EQ(kiln::io::bytes_read(), 32u + 144u);
}

// ---- the writer ------------------------------------------------------------------------------

TEST_F(GgufTest, WriterStreamsProducedTensors) {
  const fs::path path = dir_ / "s.gguf";
  const Tensor q = block_tensor({4, 32}, DType::q8_0, 11);
  GgufWriter writer(path, 64);
  writer.set_metadata("general.architecture", GgufValue{std::string("flux")});
  writer.add_tensor("q", DType::q8_0, {4, 32}, [&](const GgufWriter::Emit& emit) {
    const auto* p = static_cast<const char*>(q.data_ptr());
    emit(p, 10);  // pieces of any size
    emit(p + 10, 0);
    emit(p + 10, q.nbytes() - 10);
  });
  writer.add_tensor("b", make_tensor<float>({3}, DType::f32, {1, 2, 3}));
  const uint64_t planned = writer.file_bytes();
  EXPECT_EQ(writer.write(), planned);
  EXPECT_EQ(fs::file_size(path), planned);
  const GgufFile file(path);
  EXPECT_TRUE(same_bytes(file.load("q"), q));
  EXPECT_EQ(as_f32(file.load("b")), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(file.info("b").byte_begin - file.info("q").byte_begin, 192u);  // 136 bytes padded to 64
}

TEST_F(GgufTest, WriterRejectsBadInputWithoutLeavingFiles) {
  const fs::path path = dir_ / "bad.gguf";
  const auto producer_of = [](size_t bytes) {
    return [bytes](const GgufWriter::Emit& emit) {
      const std::vector<char> zeros(bytes);
      emit(zeros.data(), bytes);
    };
  };
  {
    GgufWriter w(path);
    w.add_tensor("short", DType::f32, {4}, producer_of(12));
    expect_error([&] { w.write(); }, {"[gguf]", "bad.gguf", "tensor 'short'", "wrote 12 of the tensor's 16 bytes"});
  }
  {
    GgufWriter w(path);
    w.add_tensor("long", DType::f32, {4}, producer_of(20));
    expect_error([&] { w.write(); }, {"tensor 'long'", "more than the tensor's 16 bytes"});
  }
  {
    GgufWriter w(path);
    expect_error([&] { w.add_tensor("m", make_tensor<uint8_t>({3}, DType::boolean, {1, 0, 1})); },
                 {"bad.gguf", "tensor 'm'", "bool", "no ggml type"});
    expect_error([&] { w.add_tensor("f8", make_tensor<uint8_t>({3}, DType::f8_e4m3, {1, 0, 1})); },
                 {"tensor 'f8'", "f8_e4m3", "no ggml type"});
    expect_error([&] { w.add_tensor("k", DType::q4_k, {2, 128}, producer_of(0)); },
                 {"tensor 'k'", "q4_k", "[2,128]", "256-element block"});
    expect_error([&] { w.add_tensor("z", DType::f32, {2, 0}, producer_of(0)); }, {"tensor 'z'", "positive"});
    expect_error([&] { w.add_tensor("r", DType::f32, {1, 1, 1, 1, 1}, producer_of(4)); }, {"tensor 'r'", "4 dims"});
    expect_error([&] { w.add_tensor(std::string(64, 'n'), DType::f32, {1}, producer_of(4)); },
                 {"is 64 bytes", "at most 63"});
    w.add_tensor("x", DType::f32, {1}, producer_of(4));
    expect_error([&] { w.add_tensor("x", DType::f32, {1}, producer_of(4)); }, {"tensor 'x' is added twice"});
    expect_error([&] { w.set_metadata("general.alignment", GgufValue{uint32_t(64)}); },
                 {"general.alignment", "writer's alignment is the u32 32"});
    expect_error([&] { w.set_metadata("a", GgufValue{array_of(GgufType::u32, {GgufValue{int32_t(1)}})}); },
                 {"metadata 'a'", "array item 0 is i32 in an array of u32"});
    expect_error([&] { w.set_metadata("", GgufValue{true}); }, {"key is empty"});
  }
  expect_error([&] { GgufWriter w(path, 48); }, {"alignment 48", "power of two"});
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 0);  // no temporaries
}

TEST_F(GgufTest, WriterReplacesAnExistingFileAtomically) {
  const fs::path path = dir_ / "m.gguf";
  kiln::io::write_gguf(path, {}, {{"x", make_tensor<float>({1}, DType::f32, {1.0f})}});
  const GgufFile old(path);
  const Tensor old_x = old.load("x");
  kiln::io::write_gguf(path, {}, {{"y", make_tensor<float>({2}, DType::f32, {2.0f, 3.0f})}});
  EXPECT_EQ(as_f32(old_x), std::vector<float>{1.0f});  // the old mapping is untouched
  const GgufFile now(path);
  EXPECT_EQ(now.names(), std::vector<std::string>{"y"});
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

// ---- files written by gguf-py (tests/fixtures/gguf) -----------------------------------------

fs::path fixture_dir() { return fs::path(KILN_FIXTURES_DIR) / "gguf"; }

GgufType type_named(const std::string& name) {
  for (uint32_t t = 0; t <= uint32_t(GgufType::f64); ++t)
    if (name == kiln::io::gguf_type_name(GgufType(t))) return GgufType(t);
  ADD_FAILURE() << "unknown type " << name;
  return GgufType::u8;
}

GgufValue value_from_json(const nlohmann::json& j) {
  const GgufType type = type_named(j.at("type").get<std::string>());
  const nlohmann::json& v = type == GgufType::array ? j : j.at("value");
  switch (type) {
    case GgufType::u8: return GgufValue{v.get<uint8_t>()};
    case GgufType::i8: return GgufValue{v.get<int8_t>()};
    case GgufType::u16: return GgufValue{v.get<uint16_t>()};
    case GgufType::i16: return GgufValue{v.get<int16_t>()};
    case GgufType::u32: return GgufValue{v.get<uint32_t>()};
    case GgufType::i32: return GgufValue{v.get<int32_t>()};
    case GgufType::f32: return GgufValue{float(v.get<double>())};  // the JSON holds the f32 exactly
    case GgufType::boolean: return GgufValue{v.get<bool>()};
    case GgufType::string: return GgufValue{v.get<std::string>()};
    case GgufType::u64: return GgufValue{v.get<uint64_t>()};
    case GgufType::i64: return GgufValue{v.get<int64_t>()};
    case GgufType::f64: return GgufValue{v.get<double>()};
    case GgufType::array: {
      GgufArray a;
      a.type = type_named(j.at("item_type").get<std::string>());
      for (const auto& item : j.at("items")) a.items.push_back(value_from_json(item));
      return GgufValue{a};
    }
  }
  return {};
}

nlohmann::json expected_json() {
  std::ifstream in(fixture_dir() / "expected.json");
  return nlohmann::json::parse(in);
}

TEST(GgufFixture, ReadsGgufPyFilesExactly) {
  const nlohmann::json expected = expected_json();
  const std::string blob = read_bytes(fixture_dir() / "expected.bin");
  ASSERT_EQ(expected.size(), 2u);
  for (const auto& [file_name, want] : expected.items()) {
    SCOPED_TRACE(file_name);
    const GgufFile file(fixture_dir() / file_name);
    EXPECT_EQ(file.version(), want.at("version").get<uint32_t>());
    EXPECT_EQ(file.alignment(), want.at("alignment").get<uint32_t>());
    GgufMetadata metadata;
    for (const auto& [key, value] : want.at("metadata").items()) metadata.emplace(key, value_from_json(value));
    EXPECT_EQ(file.metadata().size(), metadata.size());
    for (const auto& [key, value] : metadata) {
      const GgufValue* got = file.find_metadata(key);
      ASSERT_NE(got, nullptr) << key;
      EXPECT_EQ(*got, value) << key << ": " << got->to_string() << " vs " << value.to_string();
    }
    std::vector<std::string> names;
    for (const auto& t : want.at("tensors")) {
      const std::string name = t.at("name").get<std::string>();
      SCOPED_TRACE(name);
      names.push_back(name);
      const kiln::io::GgufTensorInfo& info = file.info(name);
      EXPECT_EQ(info.ggml_type, t.at("ggml_type").get<uint32_t>());
      EXPECT_EQ(info.dtype, *kiln::io::dtype_of_ggml_type(info.ggml_type));
      EXPECT_EQ(info.shape, t.at("shape").get<Shape>());
      EXPECT_EQ(info.byte_begin, t.at("byte_begin").get<uint64_t>());
      const size_t nbytes = t.at("nbytes").get<size_t>();
      EXPECT_EQ(info.nbytes(), nbytes);
      const Tensor loaded = file.load(name);
      EXPECT_TRUE(in_mapping(file, loaded));
      ASSERT_EQ(loaded.nbytes(), nbytes);
      EXPECT_EQ(std::memcmp(loaded.data_ptr(), blob.data() + t.at("bytes_at").get<size_t>(), nbytes), 0);
    }
    EXPECT_EQ(file.names(), names);
  }
}

// load(name, f32) of every float and block tensor against gguf-py's dequantize, bit for bit.
TEST(GgufFixture, F32ValuesMatchGgufPyDequantize) {
  const nlohmann::json expected = expected_json();
  const std::string blob = read_bytes(fixture_dir() / "expected.bin");
  for (const auto& [file_name, want] : expected.items()) {
    const GgufFile file(fixture_dir() / file_name);
    for (const auto& t : want.at("tensors")) {
      if (!t.contains("f32_at")) continue;
      const std::string name = t.at("name").get<std::string>();
      SCOPED_TRACE(file_name + ": " + name);
      const std::vector<float> got = as_f32(file.load(name, DType::f32));
      std::vector<float> ref(got.size());
      std::memcpy(ref.data(), blob.data() + t.at("f32_at").get<size_t>(), ref.size() * 4);
      double worst = 0;
      size_t differing = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        if (std::memcmp(&got[i], &ref[i], 4) != 0) ++differing;
        worst = std::max(worst, std::fabs(double(got[i]) - double(ref[i])));
      }
      EXPECT_EQ(differing, 0u) << "max abs diff " << worst;
    }
  }
}

// Rewriting a gguf-py file with kiln's writer gives the same data section, byte for byte: the
// same offsets and padding.
TEST_F(GgufTest, WriterLaysOutDataAsGgufPyDoes) {
  for (const char* name : {"mixed.gguf", "aligned64.gguf"}) {
    SCOPED_TRACE(name);
    const GgufFile original(fixture_dir() / name);
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const std::string& t : original.names()) tensors.emplace_back(t, original.load(t));
    GgufMetadata metadata = original.metadata();
    metadata.erase("general.alignment");
    const fs::path path = dir_ / name;
    kiln::io::write_gguf(path, metadata, tensors, original.alignment());
    const GgufFile copy(path);
    EXPECT_EQ(copy.metadata(), original.metadata());
    const std::string a = read_bytes(fixture_dir() / name), b = read_bytes(path);
    EXPECT_EQ(a.substr(original.data_offset()), b.substr(copy.data_offset()));
  }
}

// ---- as a WeightSource -----------------------------------------------------------------------

TEST_F(GgufTest, OpenCheckpointReadsGgufFiles) {
  const fs::path path = dir_ / "transformer.gguf";
  const Tensor q = block_tensor({2, 32}, DType::q4_0, 12);
  kiln::io::write_gguf(path, {},
                       {{"w", make_tensor<uint16_t>({2, 3}, DType::bf16, to_bf16(iota_f32(6)))},
                        {"q", q},
                        {"ids", make_tensor<int32_t>({2}, DType::i32, {1, 2})}});
  const auto source = kiln::nn::open_checkpoint(path);
  EXPECT_EQ(source->describe(), path.string());
  EXPECT_TRUE(source->contains("q"));
  EXPECT_FALSE(source->contains("nope"));
  EXPECT_EQ(source->shape("w"), (Shape{2, 3}));
  EXPECT_EQ(source->stored_dtype("q"), DType::q4_0);
  EXPECT_EQ(source->stored_dtype("w"), DType::bf16);
  EXPECT_EQ(source->names(), (std::vector<std::string>{"w", "q", "ids"}));
  EXPECT_EQ(kiln::nn::stored_float_dtype(*source), DType::bf16);
  EXPECT_TRUE(same_bytes(source->load("q", DType::q4_0), q));
  const Tensor w = source->load("w", DType::f32);
  EXPECT_EQ(as_f32(w), as_f32(make_tensor<uint16_t>({2, 3}, DType::bf16, to_bf16(iota_f32(6)))));
  EXPECT_EQ(source->unread(), std::vector<std::string>{"ids"});
  expect_error([&] { source->load("ids", DType::f32); }, {"transformer.gguf", "'ids'", "I32"});
  const Tensor row = source->load_slice("q", 0, 1, 1, DType::q4_0);
  EXPECT_EQ(std::memcmp(row.data_ptr(), static_cast<const char*>(q.data_ptr()) + 18, 18), 0);
}

// ---- malformed files ------------------------------------------------------------------------

// A hand-made GGUF file, field by field.
struct RawGguf {
  std::string b;
  RawGguf& u8(uint8_t v) { return put(v); }
  RawGguf& u32(uint32_t v) { return put(v); }
  RawGguf& u64(uint64_t v) { return put(v); }
  RawGguf& str(const std::string& s) {
    u64(s.size());
    b += s;
    return *this;
  }
  RawGguf& header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
    b += "GGUF";
    return u32(version).u64(tensors).u64(kvs);
  }
  RawGguf& kv_u32(const std::string& key, uint32_t v) { return str(key).u32(4).u32(v); }
  RawGguf& kv_str(const std::string& key, const std::string& v) { return str(key).u32(8).str(v); }
  RawGguf& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).u32(uint32_t(ne.size()));
    for (uint64_t d : ne) u64(d);
    return u32(type).u64(offset);
  }
  RawGguf& pad(size_t alignment = 32) {
    b.resize((b.size() + alignment - 1) / alignment * alignment, '\0');
    return *this;
  }
  RawGguf& data(size_t n) {
    b.append(n, '\x3c');  // 0x3c3c: a finite f16/bf16 and a fine f32
    return *this;
  }
  template <typename T>
  RawGguf& put(T v) {
    char c[sizeof(T)];
    std::memcpy(c, &v, sizeof(T));
    b.append(c, sizeof(T));
    return *this;
  }
};

class GgufBadFile : public GgufTest {
 protected:
  // Writes `raw` to bad.gguf and expects opening it to fail naming the file and `parts`.
  void expect_rejected(const RawGguf& raw, std::vector<std::string> parts) {
    const fs::path path = dir_ / "bad.gguf";
    write_bytes(path, raw.b);
    parts.insert(parts.begin(), {"[gguf]", path.string() + ": "});
    expect_error([&] { GgufFile f(path); }, parts);
  }
};

TEST_F(GgufBadFile, AWellFormedHandMadeFileOpens) {  // the baseline the other cases break
  RawGguf raw;
  raw.header(2, 1).kv_str("general.architecture", "flux").tensor("a", {4, 2}, 0, 0).tensor("b", {32}, 8, 32);
  raw.pad().data(32 + 34);
  const fs::path path = dir_ / "good.gguf";
  write_bytes(path, raw.b);
  const GgufFile file(path);
  EXPECT_EQ(file.info("a").shape, (Shape{2, 4}));
  EXPECT_EQ(file.info("b").dtype, DType::q8_0);
  EXPECT_EQ(*file.find_metadata("general.architecture")->as_string(), "flux");
}

TEST_F(GgufBadFile, EveryTruncation) {
  const fs::path good = dir_ / "good.gguf";
  kiln::io::write_gguf(good, {{"general.architecture", GgufValue{std::string("flux")}},
                              {"t.array", GgufValue{array_of(GgufType::string, {GgufValue{std::string("ab")}})}}},
                       {{"a", make_tensor<float>({3}, DType::f32, {1, 2, 3})}, {"q", block_tensor({1, 32}, DType::q8_0, 3)}});
  const std::string bytes = read_bytes(good);
  const uint64_t data_end = GgufFile(good).info("q").byte_end;  // past it: only the last tensor's padding
  const fs::path path = dir_ / "cut.gguf";
  for (size_t len = 0; len < bytes.size(); ++len) {
    SCOPED_TRACE(len);
    write_bytes(path, bytes.substr(0, len));
    if (len >= data_end) {
      EXPECT_NO_THROW(GgufFile f(path));
      continue;
    }
    try {
      GgufFile f(path);
      ADD_FAILURE() << "a file cut to " << len << " bytes opened";
    } catch (const kiln::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("[gguf] " + path.string() + ": "), std::string::npos) << msg;
      EXPECT_TRUE(msg.find("truncated") != std::string::npos || msg.find("runs past the end") != std::string::npos ||
                  msg.find("cannot fit") != std::string::npos)
          << msg;
    }
  }
}

TEST_F(GgufBadFile, EmptyFile) { expect_rejected(RawGguf{}, {"file is truncated", "the magic 'GGUF'", "0 bytes"}); }

TEST_F(GgufBadFile, BadMagicAndVersions) {
  RawGguf raw;
  raw.b = "GGML";
  raw.u32(3).u64(0).u64(0);
  expect_rejected(raw, {"not a GGUF file", "'GGML'", "expected the magic 'GGUF'"});
  expect_rejected(RawGguf{}.header(0, 0, 1), {"GGUF version 1 is not supported", "versions 2 and 3"});
  expect_rejected(RawGguf{}.header(0, 0, 4), {"unsupported GGUF version 4"});
  expect_rejected(RawGguf{}.header(0, 0, 0x03000000), {"unsupported GGUF version 50331648", "big-endian"});
  const fs::path path = dir_ / "v2.gguf";
  write_bytes(path, RawGguf{}.header(0, 0, 2).b);
  EXPECT_EQ(GgufFile(path).version(), 2u);
}

TEST_F(GgufBadFile, TensorOffsetOutsideTheFile) {
  RawGguf raw;
  raw.header(1, 0).tensor("blk.0.w", {8}, 0, 64).pad().data(32);
  expect_rejected(raw, {"tensor 'blk.0.w'", "32 bytes at offset 64", "runs past the end of the file"});
  RawGguf huge;  // offset + size overflows 64 bits
  huge.header(1, 0).tensor("w", {8}, 0, ~uint64_t(31)).pad().data(32);
  expect_rejected(huge, {"tensor 'w'", "runs past the end of the file"});
}

TEST_F(GgufBadFile, UnknownQuantType) {
  RawGguf raw;
  raw.header(1, 0).tensor("x", {32}, 7, 0).pad().data(24);
  expect_rejected(raw, {"tensor 'x'", "unsupported ggml type 7 (Q5_1)",
                        "kiln reads F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K"});
  RawGguf q6;
  q6.header(1, 0).tensor("blk.3.ffn", {256}, 14, 0).pad().data(210);
  expect_rejected(q6, {"tensor 'blk.3.ffn'", "type 14 (Q6_K)"});
  RawGguf unknown;
  unknown.header(1, 0).tensor("x", {4}, 99, 0).pad().data(16);
  expect_rejected(unknown, {"tensor 'x'", "unknown ggml type 99 (?)"});
}

TEST_F(GgufBadFile, StringsLongerThanTheFile) {
  RawGguf value;
  value.header(0, 1).str("general.name").u32(8).u64(1000000).data(10);
  expect_rejected(value, {"metadata 'general.name'", "string length 1000000", "runs past the end of the file"});
  RawGguf huge;  // must not try to allocate 2^63 bytes
  huge.header(0, 1).str("k").u32(8).u64(uint64_t(1) << 63);
  expect_rejected(huge, {"metadata 'k'", "string length 9223372036854775808", "runs past the end"});
  RawGguf key;
  key.header(0, 1).u64(500).data(20);
  expect_rejected(key, {"metadata key 0", "string length 500", "runs past the end"});
  RawGguf name;
  name.header(1, 0).u64(~uint64_t(0)).data(30);
  expect_rejected(name, {"the name of tensor 0", "string length 18446744073709551615"});
}

TEST_F(GgufBadFile, AbsurdCounts) {
  expect_rejected(RawGguf{}.header(0, uint64_t(1) << 40).data(64), {"metadata count 1099511627776", "cannot fit"});
  expect_rejected(RawGguf{}.header(uint64_t(1) << 60, 0).data(64), {"tensor count 1152921504606846976", "cannot fit"});
  RawGguf array;
  array.header(0, 1).str("tokens").u32(9).u32(8).u64(uint64_t(1) << 62).data(64);
  expect_rejected(array, {"metadata 'tokens'", "array of 4611686018427387904 string items", "cannot fit"});
}

TEST_F(GgufBadFile, DuplicateNamesAndKeys) {
  RawGguf tensors;
  tensors.header(2, 0).tensor("w", {4}, 0, 0).tensor("w", {4}, 0, 32).pad().data(48);
  expect_rejected(tensors, {"duplicate tensor name 'w'"});
  RawGguf keys;
  keys.header(0, 2).kv_u32("general.alignment", 32).kv_u32("general.alignment", 32);
  expect_rejected(keys, {"duplicate metadata key 'general.alignment'"});
}

TEST_F(GgufBadFile, MisalignedOffsetsAndBadAlignment) {
  RawGguf raw;
  raw.header(1, 0).tensor("w", {4}, 0, 16).pad().data(64);
  expect_rejected(raw, {"tensor 'w'", "offset 16", "not a multiple of the alignment 32"});
  RawGguf a64;
  a64.header(1, 1).kv_u32("general.alignment", 64).tensor("w", {4}, 0, 32).pad(64).data(64);
  expect_rejected(a64, {"tensor 'w'", "offset 32", "alignment 64"});
  expect_rejected(RawGguf{}.header(0, 1).kv_u32("general.alignment", 48), {"'general.alignment' is 48", "power of two"});
  expect_rejected(RawGguf{}.header(0, 1).kv_u32("general.alignment", 0), {"'general.alignment' is 0"});
  expect_rejected(RawGguf{}.header(0, 1).str("general.alignment").u32(5).u32(32),
                  {"'general.alignment' is i32 32", "expected a u32"});
}

TEST_F(GgufBadFile, BadDimsAndBlocks) {
  expect_rejected(RawGguf{}.header(1, 0).tensor("w", {4, 0}, 0, 0).pad().data(32), {"tensor 'w' dim 1 is 0"});
  expect_rejected(RawGguf{}.header(1, 0).tensor("w", {1, 1, 1, 1, 1}, 0, 0).pad().data(32), {"tensor 'w' has 5 dims"});
  expect_rejected(RawGguf{}.header(1, 0).tensor("w", {uint64_t(1) << 32, uint64_t(1) << 32}, 0, 0).pad().data(32),
                  {"tensor 'w'", "overflow"});
  expect_rejected(RawGguf{}.header(1, 0).tensor("w", {uint64_t(1) << 63}, 0, 0).pad().data(32),
                  {"tensor 'w' dim 0 is 9223372036854775808"});
  expect_rejected(RawGguf{}.header(1, 0).tensor("w", {33, 2}, 8, 0).pad().data(128),
                  {"tensor 'w' (Q8_0)", "rows of 33 elements", "32-element block"});
  expect_rejected(RawGguf{}.header(1, 0).tensor("w", {uint64_t(1) << 62}, 0, 0).pad().data(32),
                  {"tensor 'w'", "overflows 64 bits"});
}

TEST_F(GgufBadFile, OverlappingTensors) {
  RawGguf raw;
  raw.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).pad().data(64);
  expect_rejected(raw, {"tensors 'a'", "and 'b'", "overlap"});
}

TEST_F(GgufBadFile, BadMetadataValues) {
  expect_rejected(RawGguf{}.header(0, 1).str("flag").u32(7).u8(2), {"metadata 'flag'", "bool byte 2", "neither 0 nor 1"});
  expect_rejected(RawGguf{}.header(0, 1).str("k").u32(13).u32(0), {"metadata 'k'", "unknown value type 13"});
  expect_rejected(RawGguf{}.header(0, 1).str("k").u32(9).u32(42).u64(0), {"metadata 'k'", "unknown item type 42"});
  expect_rejected(RawGguf{}.header(0, 1).str("").u32(4).u32(0), {"metadata key 0 is empty"});
  RawGguf deep;
  deep.header(0, 1).str("deep").u32(9);
  for (int i = 0; i < 20; ++i) deep.u32(9).u64(1);
  deep.u32(0).u64(0);
  expect_rejected(deep, {"metadata 'deep'", "nested more than 16 deep"});
}

// ---- fuzz ----------------------------------------------------------------------------------
// The mutations and the load-everything check are tests/gguf_fuzzing.h's (shared with the
// sanitizer program tests/sanitize/gguf_fuzz.cc).

TEST_F(GgufTest, MutatedFilesOnlyEverThrowKilnError) {
  const fs::path good = dir_ / "good.gguf";
  const std::string valid = kiln::test::valid_gguf_file(good);
  const uint64_t header_len = GgufFile(good).data_offset();

  kiln::test::SplitMix64 rng{20250119};
  constexpr long kCases = 3000;
  const auto r = kiln::test::fuzz_gguf(valid, header_len, dir_ / "fuzz.gguf", rng, kCases);
  ASSERT_EQ(r.failure, "");
  EXPECT_EQ(r.opened + r.rejected, kCases);
  EXPECT_GT(r.rejected, kCases / 4);
  EXPECT_GT(r.opened, kCases / 20);
}

}  // namespace
