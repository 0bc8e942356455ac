// The tile driver of the elementwise kernels. The output's index space is cut into tiles of at
// most kTile elements along its innermost (coalesced) run; each input is read through its
// strides, broadcast to the output shape, into an f32 tile; results are rounded into the
// output's dtype. The eager kernels (one op per kernel, elementwise.cc) and the fused kernel
// (a chain of ops per tile, fused_elementwise.cc) share it, so both visit the same elements in
// the same tiles and load/store them through the same conversions.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/tensor_view.h"
#include "devices/cpu/kernels/strided.h"
#include "devices/runtime.h"
#include "devices/cpu/kernels/level.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

constexpr int64_t kTile = 2048;            // floats per operand per tile (fits L1 for 3 operands)
constexpr int64_t kParallelMin = 1 << 15;  // elements below which threads cost more than they save

struct Operand {
  const char* base;
  DType dtype;
  // An index operand (a fused arange): its "value" at element offset o is float(start + o * step);
  // base is never read.
  bool iota = false;
  double start = 0, step = 1;
};

// Loads `n` elements of an operand starting at element offset `off` with stride `stride`
// into f32; returns a pointer to them (the operand itself when it is dense f32, in which case
// `buf` is not touched).
const float* load_tile(const Operand& op, int64_t off, int64_t stride, int64_t n, float* buf);

// One tile of the output: elements [start, start + n) of row `row` of the strided loop. When
// rows are short (a view that keeps the innermost dims from coalescing, e.g. a reversed pair
// dim), a tile is several whole rows: start = 0 and n = rows * inner, contiguous in the output.
struct Tile {
  int64_t row, start, n;
};

// The tiling of one kernel call. The output must be dense (as every buffer the dispatcher
// allocates is); inputs may be strided and broadcast (stride 0) views of any dtype.
class TileGrid {
 public:
  TileGrid(const std::vector<TensorView>& in, const TensorView& out);

  // Makes input k an index operand (Operand::iota): it is laid out as a dense [count] vector.
  void set_iota(size_t k, double start, double step) {
    ops_[k].iota = true;
    ops_[k].start = start;
    ops_[k].step = step;
  }
  int64_t tasks() const { return tasks_; }
  bool parallel() const { return numel_ >= kParallelMin; }
  Tile tile(int64_t t) const {
    if (rows_per_tile_ > 1) {
      const int64_t row = t * rows_per_tile_;
      return {row, 0, std::min(rows_per_tile_, loop_.outer_count() - row) * loop_.inner};
    }
    const int64_t row = t / tiles_per_row_, start = (t % tiles_per_row_) * kTile;
    return {row, start, std::min(kTile, loop_.inner - start)};
  }
  // Input k's values over `tile` as f32: a pointer into the input itself when load_is_view(k),
  // else into `buf` (kTile floats).
  const float* load(size_t k, const Tile& tile, float* buf) const {
    if (rows_per_tile_ > 1 && !flat_[k]) return load_rows(k, tile, buf);
    const int64_t off = loop_.offset(k, tile.row) + tile.start * loop_.inner_stride[k];
    return load_tile(ops_[k], off, flat_[k] && rows_per_tile_ > 1 ? 1 : loop_.inner_stride[k], tile.n, buf);
  }
  // Whether load(k, ...) always returns the input's own memory (dense f32 along the tile).
  bool load_is_view(size_t k) const {
    return !ops_[k].iota && ops_[k].dtype == DType::f32 && (rows_per_tile_ > 1 ? flat_[k] : loop_.inner_stride[k] == 1);
  }
  // The output's memory for `tile` when the output is f32 (a kernel may compute straight into
  // it), else nullptr.
  float* out_f32(const Tile& tile) const {
    if (out_dtype_ != DType::f32) return nullptr;
    return reinterpret_cast<float*>(out_base_) + out_offset(tile);
  }
  // Rounds `y` (tile.n floats) into the output's dtype at `tile`.
  void store(const Tile& tile, const float* y) const;

 private:
  int64_t out_offset(const Tile& tile) const { return loop_.offset(ops_.size(), tile.row) + tile.start; }
  const float* load_rows(size_t k, const Tile& tile, float* buf) const;

  std::vector<Operand> ops_;
  StridedLoop loop_;  // operands 0..n-1 are the inputs, operand n is the output
  // Per operand: laid out densely in loop order (row r at r * inner, unit inner stride), so a
  // run of whole rows is one contiguous range.
  std::vector<char> flat_;
  // Multi-row tiles: each other operand's own loop over the output's index space, coalesced for
  // that operand alone (its runs are often much longer than the joint rows).
  std::vector<StridedLoop> own_;
  int64_t rows_per_tile_ = 1;
  int64_t tiles_per_row_ = 0, tasks_ = 0, numel_ = 0;
  char* out_base_ = nullptr;
  DType out_dtype_ = DType::f32;
};

// Runs `body(state, tile)` for every tile of `grid`, in parallel over tiles for large outputs;
// `make_state()` builds each thread's scratch (tile buffers) once per call.
template <typename MakeState, typename Body>
void for_each_tile(const TileGrid& grid, MakeState make_state, Body body) {
  const int64_t tasks = grid.tasks();
#pragma omp parallel if (grid.parallel())
  {
    auto state = make_state();
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) body(state, grid.tile(t));
  }
}

// The one-op driver: runs `compute(const float* const* ins, float* out, int64_t n)` over the
// output in tiles, with every input loaded as f32 and the result rounded into the output.
template <typename Compute>
void run_tiles(const KernelArgs& args, Compute compute) {
  const TileGrid grid(args.in, args.out);
  const size_t n_in = args.in.size();
  struct Scratch {
    std::vector<float> bufs;  // one tile per input, plus one for the result
    std::vector<const float*> ins;
  };
  for_each_tile(
      grid, [&] { return Scratch{std::vector<float>((n_in + 1) * size_t(kTile)), std::vector<const float*>(n_in)}; },
      [&](Scratch& s, const Tile& tile) {
        for (size_t k = 0; k < n_in; ++k) s.ins[k] = grid.load(k, tile, s.bufs.data() + k * size_t(kTile));
        float* direct = grid.out_f32(tile);
        float* y = direct ? direct : s.bufs.data() + n_in * size_t(kTile);
        compute(s.ins.data(), y, tile.n);
        if (!direct) grid.store(tile, y);
      });
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL
