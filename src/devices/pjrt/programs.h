// The programs the PJRT device compiles. A kiln buffer on a PJRT device is one device buffer of
// raw bytes (u8[bytes]) whatever the dtypes of the tensors viewing it, so a program takes whole
// buffers and reads each tensor out of its bytes (a slice, a bitcast, its strides), and gives its
// results back as bytes.
#pragma once
#include <string>
#include <vector>

#include "core/attrs.h"
#include "core/dtype.h"
#include "core/shape.h"

namespace kiln {
struct Graph;
}

namespace kiln::pjrt {

// A tensor inside argument `arg` of a program, `byte_offset` bytes into it.
struct ByteView {
  int arg = 0;
  int64_t byte_offset = 0;
  Shape shape;
  Strides strides;  // elements
  DType dtype = DType::f32;
};

struct OpProgramSpec {
  std::string op;
  Attrs attrs;
  std::vector<size_t> arg_bytes;  // each argument buffer's size
  std::vector<ByteView> inputs;
  ByteView out;                   // dense; out.arg < 0: a fresh buffer of out_bytes bytes
  size_t out_bytes = 0;
  int replicas = 1;               // > 1: a collective, one replica per tensor-parallel rank
};

// One op of strict eager mode: its result is the output buffer's new bytes (the updated argument
// out.arg, aliased to it, when the output is a part of an existing buffer).
std::string op_program(const OpProgramSpec& spec);

// A whole graph (deferred and compiled mode): graph input i is `inputs[i]`; one result per
// graph output, its dense bytes. With `replicas` > 1, a program for that many devices, one per
// tensor-parallel rank, its collectives joining them.
std::string graph_program(const Graph& g, const std::vector<size_t>& arg_bytes, const std::vector<ByteView>& inputs,
                          int replicas = 1);

// A whole graph for `replicas` devices at once, one per tensor-parallel rank (each runs it on its
// own slices; the collectives join them), with one typed argument per graph input and one typed
// result per output: what compiling ahead of time for another device's memory takes
// (aot_target.h). Byte buffers would make XLA lay out every weight twice on a TPU.
std::string typed_graph_program(const Graph& g, int replicas);

// `bytes` bytes of argument 0 (`src_bytes` long) at `src_offset` written over argument 1
// (`dst_bytes` long) at `dst_offset`: a copy within the device (argument 1 aliased to the result).
std::string copy_program(size_t src_bytes, size_t src_offset, size_t dst_bytes, size_t dst_offset, size_t bytes);

// A buffer of `bytes` zero bytes (the contents of a buffer before its first write).
std::string zeros_program(size_t bytes);

}  // namespace kiln::pjrt
