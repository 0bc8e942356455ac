#include "io/gguf.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstring>
#include <limits>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "io/input_file.h"

namespace kiln::io {
namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader maps little-endian files and reads them in place");

namespace {

constexpr const char* kWhere = "gguf";
// The spec's limits: a metadata key is at most 65535 bytes, a tensor has at most 4 dims.
constexpr uint64_t kMaxKeyBytes = 65535;
constexpr uint32_t kMaxDims = 4;
// Nested arrays deeper than this are no real file's (ggml reads none at all); the parser
// recurses, so a hostile file must not choose the depth.
constexpr int kMaxArrayDepth = 16;
// Metadata values (array items included) held in memory: real files have at most a few million
// (an LLM tokenizer's vocabulary and merges); each costs ~40 bytes however small in the file.
constexpr uint64_t kMaxMetadataValues = uint64_t(1) << 24;

constexpr const char* kSupportedTypes = "F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, I32, I64";

template <typename... Parts>
[[noreturn]] void file_fail(const fs::path& file, const Parts&... parts) {
  fail(kWhere, file.string(), ": ", parts...);
}

uint64_t align_up(uint64_t v, uint64_t alignment) {
  const uint64_t r = v % alignment;
  return r == 0 ? v : v + (alignment - r);  // callers keep v far below 2^64
}

// The smallest encoding of one value of `t` (its size for scalars; a string's length field; an
// array's type and count), to bound counts by the bytes left before allocating anything.
uint64_t min_encoded_bytes(GgufType t) {
  switch (t) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean: return 1;
    case GgufType::u16:
    case GgufType::i16: return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32: return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64:
    case GgufType::string: return 8;
    case GgufType::array: return 12;
  }
  return 1;
}

bool valid_type_id(uint32_t id) { return id <= uint32_t(GgufType::f64); }

// Bounds-checked little-endian reads over the mapped header; every failure names what was
// being read and where.
class Reader {
 public:
  Reader(const fs::path& file, const unsigned char* base, uint64_t size)
      : file_(file), base_(base), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  const unsigned char* take(uint64_t n, const std::string& what) {
    if (n > left())
      file_fail(file_, "file is truncated: ", what, " needs ", n, " bytes at byte ", pos_,
                ", but the file has ", size_, " bytes");
    const unsigned char* p = base_ + pos_;
    pos_ += n;
    return p;
  }

  template <typename T>
  T get(const std::string& what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }

  // A u64 length, checked against the bytes left before anything is allocated, then the bytes.
  std::string string(const std::string& what, uint64_t max_len = UINT64_MAX) {
    const uint64_t at = pos_;
    const uint64_t len = get<uint64_t>(what + " (its length)");
    if (len > left())
      file_fail(file_, what, ": string length ", len, " at byte ", at,
                " runs past the end of the file (", left(), " bytes left of ", size_, ")");
    if (len > max_len)
      file_fail(file_, what, ": string length ", len, " at byte ", at, " exceeds the limit of ",
                max_len, " bytes");
    const unsigned char* p = take(len, what);
    return std::string(reinterpret_cast<const char*>(p), size_t(len));
  }

 private:
  const fs::path& file_;
  const unsigned char* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

// Parses metadata values (recursively for arrays), bounding every count by the bytes left.
class ValueParser {
 public:
  ValueParser(const fs::path& file, Reader& in) : file_(file), in_(in) {}

  GgufValue value(GgufType type, const std::string& what, int depth = 0) {
    switch (type) {
      case GgufType::u8: return GgufValue{in_.get<uint8_t>(what)};
      case GgufType::i8: return GgufValue{in_.get<int8_t>(what)};
      case GgufType::u16: return GgufValue{in_.get<uint16_t>(what)};
      case GgufType::i16: return GgufValue{in_.get<int16_t>(what)};
      case GgufType::u32: return GgufValue{in_.get<uint32_t>(what)};
      case GgufType::i32: return GgufValue{in_.get<int32_t>(what)};
      case GgufType::f32: return GgufValue{in_.get<float>(what)};
      case GgufType::u64: return GgufValue{in_.get<uint64_t>(what)};
      case GgufType::i64: return GgufValue{in_.get<int64_t>(what)};
      case GgufType::f64: return GgufValue{in_.get<double>(what)};
      case GgufType::boolean: {
        const uint64_t at = in_.pos();
        const uint8_t b = in_.get<uint8_t>(what);
        if (b > 1)
          file_fail(file_, what, ": bool byte ", unsigned(b), " at byte ", at,
                    " is neither 0 nor 1");
        return GgufValue{b == 1};
      }
      case GgufType::string: return GgufValue{in_.string(what)};
      case GgufType::array: return GgufValue{array(what, depth)};
    }
    file_fail(file_, what, ": unknown value type ", uint32_t(type));
  }

 private:
  GgufArray array(const std::string& what, int depth) {
    if (depth >= kMaxArrayDepth)
      file_fail(file_, what, ": arrays nested more than ", kMaxArrayDepth, " deep");
    const uint64_t at = in_.pos();
    const uint32_t type_id = in_.get<uint32_t>(what + " (its array item type)");
    if (!valid_type_id(type_id))
      file_fail(file_, what, ": array at byte ", at, " has unknown item type ", type_id,
                " (value types are 0..12)");
    const auto type = GgufType(type_id);
    const uint64_t n = in_.get<uint64_t>(what + " (its array length)");
    if (n > in_.left() / min_encoded_bytes(type))
      file_fail(file_, what, ": array of ", n, " ", gguf_type_name(type), " items at byte ", at,
                " cannot fit in the ", in_.left(), " bytes left in the file");
    values_ += n;
    if (values_ > kMaxMetadataValues)
      file_fail(file_, what, ": the metadata holds more than ", kMaxMetadataValues,
                " values; kiln refuses files this large");
    GgufArray out;
    out.type = type;
    out.items.reserve(size_t(n));
    for (uint64_t i = 0; i < n; ++i) out.items.push_back(value(type, what, depth + 1));
    return out;
  }

  const fs::path& file_;
  Reader& in_;
  uint64_t values_ = 0;
};

// Names and keys from the file in messages: printable, and short whatever the file says.
std::string shown(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, 120)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out += c;
    } else {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  if (s.size() > 120) out += "...";
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Types

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::u8: return "u8";
    case GgufType::i8: return "i8";
    case GgufType::u16: return "u16";
    case GgufType::i16: return "i16";
    case GgufType::u32: return "u32";
    case GgufType::i32: return "i32";
    case GgufType::f32: return "f32";
    case GgufType::boolean: return "bool";
    case GgufType::string: return "string";
    case GgufType::array: return "array";
    case GgufType::u64: return "u64";
    case GgufType::i64: return "i64";
    case GgufType::f64: return "f64";
  }
  return "?";
}

bool GgufArray::operator==(const GgufArray& o) const { return type == o.type && items == o.items; }

std::optional<int64_t> GgufValue::as_int() const {
  return std::visit(
      [](const auto& v) -> std::optional<int64_t> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, uint64_t>) {
          if (v > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
          return int64_t(v);
        } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          return int64_t(v);
        } else {
          return std::nullopt;
        }
      },
      value);
}

const std::string* GgufValue::as_string() const { return std::get_if<std::string>(&value); }

std::string GgufValue::to_string() const {
  std::ostringstream os;
  std::visit(
      [&os](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          os << '"' << shown(v) << '"';
        } else if constexpr (std::is_same_v<T, GgufArray>) {
          os << '[' << gguf_type_name(v.type) << " x " << v.items.size() << ']';
        } else if constexpr (std::is_same_v<T, bool>) {
          os << (v ? "true" : "false");
        } else if constexpr (std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t>) {
          os << int(v);
        } else {
          os << v;
        }
      },
      value);
  return os.str();
}

namespace {

// ggml_type names by id (ids 4, 5, 31..33 and 36..38 are retired layouts, named as they were).
constexpr const char* kGgmlTypeNames[] = {
    "F32",     "F16",      "Q4_0",     "Q4_1",     "Q4_2",       "Q4_3",       "Q5_0",
    "Q5_1",    "Q8_0",     "Q8_1",     "Q2_K",     "Q3_K",       "Q4_K",       "Q5_K",
    "Q6_K",    "Q8_K",     "IQ2_XXS",  "IQ2_XS",   "IQ3_XXS",    "IQ1_S",      "IQ4_NL",
    "IQ3_S",   "IQ2_S",    "IQ4_XS",   "I8",       "I16",        "I32",        "I64",
    "F64",     "IQ1_M",    "BF16",     "Q4_0_4_4", "Q4_0_4_8",   "Q4_0_8_8",   "TQ1_0",
    "TQ2_0",   "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4", "NVFP4",      "Q1_0",
    "Q2_0",
};

struct GgmlDType {
  uint32_t id;
  DType dtype;
};
constexpr GgmlDType kGgmlDTypes[] = {
    {0, DType::f32},  {1, DType::f16},  {2, DType::q4_0},  {8, DType::q8_0}, {12, DType::q4_k},
    {13, DType::q5_k}, {26, DType::i32}, {27, DType::i64}, {30, DType::bf16},
};

}  // namespace

const char* ggml_type_name(uint32_t ggml_type) {
  return ggml_type < std::size(kGgmlTypeNames) ? kGgmlTypeNames[ggml_type] : "?";
}

std::optional<DType> dtype_of_ggml_type(uint32_t ggml_type) {
  for (const GgmlDType& e : kGgmlDTypes)
    if (e.id == ggml_type) return e.dtype;
  return std::nullopt;
}

std::optional<uint32_t> ggml_type_of(DType t) {
  for (const GgmlDType& e : kGgmlDTypes)
    if (e.dtype == t) return e.id;
  return std::nullopt;
}

bool has_gguf_magic(const fs::path& path) {
  std::string problem;
  const int fd = open_input_file(path, &problem);
  if (fd < 0) return false;
  char magic[4] = {};
  const bool gguf = ::pread(fd, magic, 4, 0) == 4 && std::memcmp(magic, "GGUF", 4) == 0;
  ::close(fd);
  return gguf;
}

// ---------------------------------------------------------------------------------------------
// GgufFile

GgufFile::GgufFile(const fs::path& path) : file_(path, kWhere) { parse(); }

void GgufFile::parse() {
  const uint64_t file_size = file_.size();
  Reader in(path(), reinterpret_cast<const unsigned char*>(file_.bytes().data()), file_size);

  // ---- header
  const unsigned char* magic = in.take(4, "the magic 'GGUF'");
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    std::string got;
    for (int i = 0; i < 4; ++i) got += std::isprint(magic[i]) ? char(magic[i]) : '?';
    file_.fail("not a GGUF file: it starts with '", got, "', expected the magic 'GGUF'");
  }
  version_ = in.get<uint32_t>("the version");
  if (version_ != 2 && version_ != 3) {
    if (version_ == 1)
      file_.fail("GGUF version 1 is not supported (kiln reads versions 2 and 3)");
    file_.fail(
        "unsupported GGUF version ", version_, " (kiln reads versions 2 and 3)",
        (version_ & 0xffff) == 0 ? "; is it a big-endian file? kiln reads little-endian GGUF" : "");
  }
  const uint64_t tensor_count = in.get<uint64_t>("the tensor count");
  const uint64_t kv_count = in.get<uint64_t>("the metadata count");
  // A metadata entry takes at least a key length, one key byte, a type and a 1-byte value; a
  // tensor info a name length, a name byte, n_dims, a type and an offset.
  constexpr uint64_t kMinKv = 8 + 1 + 4 + 1, kMinTensor = 8 + 1 + 4 + 4 + 8;
  if (kv_count > in.left() / kMinKv)
    file_.fail("metadata count ", kv_count, " cannot fit in the ", in.left(),
               " bytes left in the file (an entry takes at least ", kMinKv, " bytes)");
  if (tensor_count > in.left() / kMinTensor ||
      kv_count * kMinKv + tensor_count * kMinTensor > in.left())
    file_.fail("tensor count ", tensor_count, " (with ", kv_count,
               " metadata entries) cannot fit in the ", in.left(),
               " bytes left in the file (a tensor info takes at least ", kMinTensor, " bytes)");

  // ---- metadata
  ValueParser values(path(), in);
  for (uint64_t i = 0; i < kv_count; ++i) {
    const std::string key = in.string("metadata key " + std::to_string(i), kMaxKeyBytes);
    if (key.empty()) file_.fail("metadata key ", i, " is empty");
    const std::string what = "metadata '" + shown(key) + "'";
    if (metadata_.count(key)) file_.fail("duplicate metadata key '", shown(key), "'");
    const uint64_t at = in.pos();
    const uint32_t type_id = in.get<uint32_t>(what + " (its value type)");
    if (!valid_type_id(type_id))
      file_.fail(what, " has unknown value type ", type_id, " at byte ", at,
                 " (value types are 0..12)");
    metadata_.emplace(key, values.value(GgufType(type_id), what));
  }
  if (const GgufValue* a = find_metadata("general.alignment")) {
    const uint32_t* v = std::get_if<uint32_t>(&a->value);
    if (!v)
      file_.fail("metadata 'general.alignment' is ", gguf_type_name(a->type()), " ", a->to_string(),
                 ", expected a u32");
    if (*v == 0 || (*v & (*v - 1)) != 0)
      file_.fail("metadata 'general.alignment' is ", *v, ", expected a nonzero power of two");
    alignment_ = *v;
  }

  // ---- tensor infos
  tensors_.reserve(size_t(tensor_count));
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo ti;
    ti.name = in.string("the name of tensor " + std::to_string(i));
    if (ti.name.empty()) file_.fail("tensor ", i, " has an empty name");
    const std::string what = "tensor '" + shown(ti.name) + "'";
    if (by_name_.count(ti.name)) file_.fail("duplicate tensor name '", shown(ti.name), "'");
    const uint32_t n_dims = in.get<uint32_t>(what + " (its number of dims)");
    if (n_dims > kMaxDims)
      file_.fail(what, " has ", n_dims, " dims; GGUF tensors have at most ", kMaxDims);
    Shape ne;
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t v = in.get<uint64_t>(what + " (dim " + std::to_string(d) + ")");
      if (v == 0 || v > uint64_t(std::numeric_limits<int64_t>::max()))
        file_.fail(what, " dim ", d, " is ", v, ", expected a positive size");
      if (__builtin_mul_overflow(numel, int64_t(v), &numel))
        file_.fail(what, " has too many elements: its dims overflow 64 bits");
      ne.push_back(int64_t(v));
    }
    ti.shape.assign(ne.rbegin(), ne.rend());
    ti.ggml_type = in.get<uint32_t>(what + " (its type)");
    const std::optional<DType> dt = dtype_of_ggml_type(ti.ggml_type);
    if (!dt)
      file_.fail(what, " has ",
                 ti.ggml_type < std::size(kGgmlTypeNames) ? "unsupported" : "unknown",
                 " ggml type ", ti.ggml_type, " (", ggml_type_name(ti.ggml_type), "): kiln reads ",
                 kSupportedTypes);
    ti.dtype = *dt;
    const int64_t block = dtype_block_elems(ti.dtype);
    const int64_t row = ne.empty() ? 1 : ne[0];
    if (row % block != 0)
      file_.fail(what, " (", ggml_type_name(ti.ggml_type), ") has rows of ", row,
                 " elements (its innermost dim), not a multiple of the ", block, "-element block");
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(uint64_t(numel / block), uint64_t(dtype_block_bytes(ti.dtype)),
                               &nbytes))
      file_.fail(what, " is too large: its size in bytes overflows 64 bits");
    ti.offset = in.get<uint64_t>(what + " (its offset)");
    if (ti.offset % alignment_ != 0)
      file_.fail(what, " has offset ", ti.offset, ", not a multiple of the alignment ", alignment_);
    ti.byte_end = nbytes;  // the size for now; made absolute below
    by_name_.emplace(ti.name, tensors_.size());
    tensors_.push_back(std::move(ti));
  }

  // ---- data section: every tensor inside the file, none overlapping
  data_offset_ = align_up(in.pos(), alignment_);
  for (GgufTensorInfo& ti : tensors_) {
    const uint64_t nbytes = ti.byte_end;
    if (data_offset_ > file_size || ti.offset > file_size - data_offset_ ||
        nbytes > file_size - data_offset_ - ti.offset)
      file_.fail("tensor '", shown(ti.name), "' (", nbytes, " bytes at offset ", ti.offset,
                 " of the data section, which starts at byte ", data_offset_,
                 ") runs past the end of the file (", file_size, " bytes)");
    ti.byte_begin = data_offset_ + ti.offset;
    ti.byte_end = ti.byte_begin + nbytes;
  }
  std::vector<const GgufTensorInfo*> order;
  order.reserve(tensors_.size());
  for (const GgufTensorInfo& ti : tensors_) order.push_back(&ti);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return a->byte_begin < b->byte_begin;
  });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->byte_begin < order[i - 1]->byte_end)
      file_.fail("tensors '", shown(order[i - 1]->name), "' (bytes [", order[i - 1]->byte_begin,
                 ", ", order[i - 1]->byte_end, ")) and '", shown(order[i]->name), "' (bytes [",
                 order[i]->byte_begin, ", ", order[i]->byte_end, ")) overlap");
}

std::vector<std::string> GgufFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const GgufTensorInfo& ti : tensors_) out.push_back(ti.name);
  return out;
}

bool GgufFile::contains(const std::string& name) const { return by_name_.count(name) > 0; }

const GgufTensorInfo& GgufFile::info(const std::string& name) const {
  const auto it = by_name_.find(name);
  if (it == by_name_.end())
    file_.fail("no tensor '", shown(name), "' in the file (it has ", tensors_.size(), " tensors)");
  return tensors_[it->second];
}

const GgufValue* GgufFile::find_metadata(const std::string& key) const {
  const auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

Tensor GgufFile::load(const std::string& name) const {
  const GgufTensorInfo& ti = info(name);
  return file_.view(ti.byte_begin, ti.shape, ti.dtype);
}

Tensor GgufFile::load(const std::string& name, DType want) const {
  const GgufTensorInfo& ti = info(name);
  return file_.load(ti.byte_begin, ti.shape, ti.dtype, want);
}

Tensor GgufFile::load_slice(const std::string& name, int dim, int64_t start, int64_t length,
                            DType want) const {
  const GgufTensorInfo& ti = info(name);
  return file_.load_slice(ti.byte_begin, ti.shape, ti.dtype, "tensor '" + shown(name) + "'", dim,
                          start, length, want);
}

}  // namespace kiln::io
