#include "nn/key_mapped_source.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "exec/host.h"
#include "io/gguf_writer.h"
#include "io/safetensors_stream_writer.h"

namespace kiln::nn {

namespace {

constexpr const char* kWhere = "key map";

// Rows [begin, begin + shape[0]) of the contiguous tensor `t`, over its buffer. Rows of a
// block-quantized type are whole blocks, so the element offset always lands on a block start.
Tensor row_view(const Tensor& t, int64_t begin, const Shape& shape) {
  KILN_CHECK(t.is_contiguous(), kWhere, "row view of a non-contiguous tensor ", t.describe());
  const int64_t row_elems = t.dim(0) == 0 ? 0 : t.numel() / t.dim(0);
  KILN_CHECK(row_elems % dtype_block_elems(t.dtype()) == 0, kWhere, "rows of ", t.describe(),
             " are not whole blocks of ", dtype_name(t.dtype()));
  return Tensor::view_of(t.buffer(), shape, t.dtype(), {}, t.offset() + begin * row_elems);
}

// The row halves of `t` in the other order, in a new buffer.
Tensor swap_halves(const Tensor& t) {
  wait(t);
  KILN_CHECK(t.is_contiguous(), kWhere, "row swap of a non-contiguous tensor ", t.describe());
  const size_t half = storage_bytes(t.dtype(), t.numel() / 2);
  BufferPtr buf = host_allocate(2 * half);
  const char* src = static_cast<const char*>(t.data_ptr());
  std::memcpy(static_cast<char*>(buf->data()), src + half, half);
  std::memcpy(static_cast<char*>(buf->data()) + half, src, half);
  return Tensor::view_of(std::move(buf), t.shape(), t.dtype());
}

}  // namespace

KeyMappedSource::KeyMappedSource(std::shared_ptr<const WeightSource> original, const io::KeyMap& map, std::string prefix)
    : original_(std::move(original)), prefix_(std::move(prefix)), map_name_(map.name) {
  std::vector<std::string> keys;
  for (const std::string& k : original_->names())
    if (k.starts_with(prefix_)) keys.push_back(k.substr(prefix_.size()));
  KILN_CHECK(!keys.empty(), kWhere, original_->describe(), ": no tensor",
             prefix_.empty() ? std::string() : " under '" + prefix_ + "'", " to read in the ", map.name, " key map");
  tensors_ = io::resolve_key_map(
      map, keys, [&](const std::string& k) { return original_->shape(prefix_ + k); }, original_->describe());
  for (const auto& [key, m] : tensors_) parts_[m.original].push_back(key);
}

std::string KeyMappedSource::describe() const {
  return original_->describe() + " (" + map_name_ + (prefix_.empty() ? "" : ", keys under '" + prefix_ + "'") + ")";
}

const io::MappedTensor& KeyMappedSource::at(const std::string& key) const {
  auto it = tensors_.find(key);
  KILN_CHECK(it != tensors_.end(), "weights", describe(), ": no tensor gives the Diffusers tensor '", key, "'");
  return it->second;
}

std::optional<DType> KeyMappedSource::stored_dtype(const std::string& key) const {
  return original_->stored_dtype(prefix_ + at(key).original);
}

Tensor KeyMappedSource::load(const std::string& key, DType dtype) const {
  const io::MappedTensor& m = at(key);
  Tensor out;
  switch (m.transform) {
    case io::KeyTransform::whole: out = original_->load(prefix_ + m.original, dtype); break;
    case io::KeyTransform::swap_halves: out = swap_halves(original_->load(prefix_ + m.original, dtype)); break;
    case io::KeyTransform::conv1x1_to_linear:
    case io::KeyTransform::rows: {
      // The parts of one original tensor share one load of it (one buffer: model offload moves
      // it once, a converted copy is made once) for as long as any part is alive.
      std::lock_guard<std::mutex> lock(loaded_mu_);
      Loaded& l = loaded_[{m.original, dtype}];
      Tensor whole;
      if (BufferPtr buf = l.buffer.lock()) {
        whole = Tensor::view_of(std::move(buf), m.original_shape, l.dtype, {}, l.offset);
      } else {
        whole = original_->load(prefix_ + m.original, dtype);
        l = Loaded{whole.buffer(), whole.offset(), whole.dtype()};
      }
      out = m.transform == io::KeyTransform::rows ? row_view(whole, m.row_begin, m.shape)
                                                  : row_view(whole, 0, m.shape);
      break;
    }
  }
  mark_read(key);
  return out;
}

Tensor KeyMappedSource::load_slice(const std::string& key, int dim, int64_t start, int64_t length, DType dtype) const {
  const io::MappedTensor& m = at(key);
  if (m.transform == io::KeyTransform::whole) {
    Tensor t = original_->load_slice(prefix_ + m.original, dim, start, length, dtype);
    mark_read(key);
    return t;
  }
  if (m.transform != io::KeyTransform::rows || m.shape.size() > 2) return WeightSource::load_slice(key, dim, start, length, dtype);
  KILN_CHECK((dim == 0 || (dim == 1 && m.shape.size() == 2)) && start >= 0 && length >= 0 &&
                 start + length <= m.shape[size_t(dim)],
             "weights", describe(), ": '", key, "' ", to_string(m.shape), " has no slice [", start, ", ", start + length,
             ") along dim ", dim);
  Tensor t;
  if (dim == 0) {
    t = original_->load_slice(prefix_ + m.original, 0, m.row_begin + start, length, dtype);
  } else {
    // Columns of every row of the original, then this part's rows copied out (not a view, which
    // would keep the other parts' columns alive with it).
    const Tensor cols = original_->load_slice(prefix_ + m.original, 1, start, length, dtype);
    wait(cols);
    const Tensor rows = row_view(cols, m.row_begin, {m.shape[0], length});
    BufferPtr buf = host_allocate(rows.nbytes());
    std::memcpy(buf->data(), rows.data_ptr(), rows.nbytes());
    t = Tensor::view_of(std::move(buf), rows.shape(), rows.dtype());
  }
  mark_read(key);
  return t;
}

std::vector<std::string> KeyMappedSource::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [key, m] : tensors_) out.push_back(key);
  return out;
}

void KeyMappedSource::mark_read(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  read_.insert(key);
}

std::vector<std::string> KeyMappedSource::unread() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [original, keys] : parts_)
    for (const std::string& k : keys)
      if (!read_.count(k)) {
        out.push_back(original);
        break;
      }
  return out;
}

namespace {

// One original-layout tensor to write: where each range of its elements comes from.
struct OriginalOut {
  std::string name;
  DType dtype;
  Shape shape;
  struct Segment {
    int64_t begin, part, part_begin, length;  // elements
  };
  std::shared_ptr<std::vector<Tensor>> parts;  // as stored: read in place from a mapped file
  std::vector<Segment> segments;               // ascending, covering the tensor
};

// The original tensors holding the Diffusers tensors of `diffusers`, each from its parts as they
// are stored. `storage_ok`: whether quantized parts may be written (GGUF) or only floats.
std::vector<OriginalOut> original_tensors(const WeightSource& diffusers, const io::KeyMap& map, const std::string& prefix,
                                          bool storage_ok) {
  const std::vector<std::string> keys = diffusers.names();
  KILN_CHECK(!keys.empty(), kWhere, diffusers.describe(), ": no tensors to write in the ", map.name, " layout");
  const std::vector<io::OriginalTensor> originals =
      io::invert_key_map(map, keys, [&](const std::string& k) { return diffusers.shape(k); }, diffusers.describe());
  std::vector<OriginalOut> out;
  for (const io::OriginalTensor& o : originals) {
    const DType dt = diffusers.stored_dtype(o.parts[0]).value_or(DType::f32);
    auto parts = std::make_shared<std::vector<Tensor>>();
    for (const std::string& p : o.parts) {
      const std::optional<DType> pt = diffusers.stored_dtype(p);
      KILN_CHECK((is_floating(dt) || (storage_ok && is_storage_only(dt))) && pt.value_or(DType::f32) == dt, kWhere,
                 diffusers.describe(), ": tensor '", p, "' is stored as ", pt ? dtype_name(*pt) : "an unknown dtype",
                 storage_ok ? "; all parts of '" : "; the safetensors writer writes f32, bf16 or f16 tensors, all parts of '",
                 o.key, "' alike");
      Tensor t = diffusers.load(p, dt);
      wait(t);
      KILN_CHECK(t.is_contiguous(), kWhere, diffusers.describe(), ": tensor '", p, "' is not contiguous");
      parts->push_back(std::move(t));
    }
    OriginalOut w{prefix + o.key, dt, o.shape, parts, {}};
    const int64_t n = numel(o.shape);
    switch (o.transform) {
      case io::KeyTransform::whole:
      case io::KeyTransform::conv1x1_to_linear: w.segments.push_back({0, 0, 0, n}); break;
      case io::KeyTransform::swap_halves:  // halves are whole rows, so whole blocks too
        w.segments.push_back({0, 0, n / 2, n / 2});
        w.segments.push_back({n / 2, 0, 0, n / 2});
        break;
      case io::KeyTransform::rows: {
        int64_t at = 0;
        for (size_t p = 0; p < parts->size(); ++p) {
          w.segments.push_back({at, int64_t(p), 0, (*parts)[p].numel()});
          at += (*parts)[p].numel();
        }
        break;
      }
    }
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace

uint64_t write_original_layout(const WeightSource& diffusers, const io::KeyMap& map, const std::filesystem::path& path,
                               const std::string& prefix) {
  std::vector<io::StreamedTensor> out;
  for (OriginalOut& o : original_tensors(diffusers, map, prefix, /*storage_ok=*/false)) {
    io::StreamedTensor st;
    st.name = o.name;
    st.dtype = o.dtype;
    st.shape = o.shape;
    st.fill = [parts = o.parts, segments = o.segments, dt = o.dtype](int64_t begin, int64_t count, float* dst) {
      for (const OriginalOut::Segment& s : segments) {
        const int64_t lo = std::max(begin, s.begin), hi = std::min(begin + count, s.begin + s.length);
        if (lo >= hi) continue;
        const char* src = static_cast<const char*>((*parts)[size_t(s.part)].data_ptr());
        convert_to_f32(src + storage_bytes(dt, s.part_begin + (lo - s.begin)), dt, dst + (lo - begin), hi - lo);
      }
    };
    out.push_back(std::move(st));
  }
  return io::write_safetensors_streamed(path, out, {{"format", "pt"}});
}

uint64_t write_original_layout_gguf(const WeightSource& diffusers, const io::KeyMap& map,
                                    const std::filesystem::path& path, const io::GgufMetadata& metadata,
                                    const std::string& prefix) {
  io::GgufWriter writer(path);
  writer.set_metadata(metadata);
  for (OriginalOut& o : original_tensors(diffusers, map, prefix, /*storage_ok=*/true)) {
    // Segments are whole rows of block-quantized tensors: their bytes are copied as they are.
    writer.add_tensor(o.name, o.dtype, o.shape, [parts = o.parts, segments = o.segments, dt = o.dtype](
                                                    const io::GgufWriter::Emit& emit) {
      for (const OriginalOut::Segment& s : segments)
        emit(static_cast<const char*>((*parts)[size_t(s.part)].data_ptr()) + storage_bytes(dt, s.part_begin),
             storage_bytes(dt, s.length));
    });
  }
  return writer.write();
}

}  // namespace kiln::nn
