// The CUDA backend's code generation, on a machine without a GPU: every elementwise op, load,
// store and rounding dtype, and fused programs with iotas, wheres and clamps, generate CUDA C
// that NVRTC compiles (PTX, and SASS for sm_90, the H100/H200 the GPU checks run on), and the
// disk cache serves a second compile. Built only with the CUDA backend (KILN_WITH_CUDA); what
// the kernels compute is checked on a GPU (scripts/gpu-check.sh: the op harness on cuda:0).
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <string>

#include "devices/cuda/builtin_kernels.h"
#include "devices/cuda/fused_codegen.h"
#include "devices/cuda/kernels/kernel_table.h"
#include "devices/cuda/nvrtc.h"
#include "graph/op.h"
#include "fused_program_builders.h"
#include "test_util.h"

namespace kiln::cuda {
namespace {

namespace fs = std::filesystem;
using Kind = FusedInstr::Kind;

constexpr int kArch = 90;

using test::binary;
using test::load;
using test::pick;
using test::round_to;
using test::unary;

// Compiles to PTX and checks the kernel is there under its name.
void expect_compiles(const KernelSource& k) {
  const CompiledCode ptx = nvrtc_compile(k.name, k.source, kArch, CodeKind::ptx, {});
  const std::string text(ptx.bytes.data());
  EXPECT_NE(text.find(".entry " + k.name), std::string::npos) << k.source;
}

TEST(CudaCodegen, EveryElementwiseOpCompiles) {
  // All unary and binary ops in one program each way they are used: every op of the vocabulary
  // is a line of one kernel, so one compile covers them.
  FusedProgram p;
  p.instrs = {load(0), load(1)};
  int acc = 0;
  for (int u = 0; u <= int(UnaryOp::clamp); ++u) {
    FusedInstr in = unary(UnaryOp(u), acc);
    if (UnaryOp(u) == UnaryOp::clamp) in.lo = -2.5f, in.hi = std::numeric_limits<float>::infinity();
    p.instrs.push_back(in);
    p.instrs.push_back(binary(BinaryOp::add, int(p.instrs.size()) - 1, 1));
    acc = int(p.instrs.size()) - 1;
  }
  for (int b = 0; b <= int(BinaryOp::ge); ++b) {
    p.instrs.push_back(binary(BinaryOp(b), acc, 1));
    acc = int(p.instrs.size()) - 1;
  }
  p.result = acc;
  const KernelSource k = fused_kernel_source(p, {DType::f32, DType::bf16}, DType::f32);
  for (int u = 0; u <= int(UnaryOp::clamp); ++u) EXPECT_NE(k.source.find(std::string("r").append(std::to_string(2 + 2 * u)).append(" =")), std::string::npos);
  expect_compiles(k);
}

TEST(CudaCodegen, EveryLoadStoreAndRoundingDtypeCompiles) {
  const std::vector<DType> dtypes = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean};
  FusedProgram p;
  for (size_t k = 0; k < dtypes.size(); ++k) p.instrs.push_back(load(int(k)));
  int acc = 0;
  for (size_t k = 1; k < dtypes.size(); ++k) {
    p.instrs.push_back(binary(BinaryOp::add, acc, int(k)));
    p.instrs.push_back(round_to(dtypes[k], int(p.instrs.size()) - 1));
    acc = int(p.instrs.size()) - 1;
  }
  p.result = acc;
  for (DType out : dtypes) expect_compiles(fused_kernel_source(p, dtypes, out));
  for (size_t bytes : {1, 2, 4, 8}) expect_compiles(strided_copy_source(bytes));
  expect_compiles(integer_cast_source(DType::i64, DType::i32));
  expect_compiles(integer_cast_source(DType::i32, DType::boolean));
}

TEST(CudaCodegen, IotaWhereAndUnusedInstructions) {
  FusedProgram p;
  FusedInstr iota;
  iota.kind = Kind::iota;
  iota.start = 0.5;
  iota.step = 0.1;
  iota.count = 7;
  p.instrs = {load(0), iota, binary(BinaryOp::gt, 0, 1), pick(2, 0, 1), unary(UnaryOp::exp, 0)};
  p.result = 3;  // the exp is never read: it is not emitted
  const KernelSource k = fused_kernel_source(p, {DType::bf16}, DType::bf16);
  EXPECT_EQ(k.source.find("r4 ="), std::string::npos);
  EXPECT_NE(k.source.find("0x1.999999999999ap-4"), std::string::npos) << "the step 0.1 as an exact double literal";
  expect_compiles(k);
  // Equal programs share a kernel; a different constant is another kernel.
  EXPECT_EQ(fused_kernel_source(p, {DType::bf16}, DType::bf16).name, k.name);
  p.instrs[1].step = 0.2;
  EXPECT_NE(fused_kernel_source(p, {DType::bf16}, DType::bf16).name, k.name);
}

// The kernels of the other ops (norms, softmax, reductions, movement, factories, sdpa, conv2d)
// are one source: it compiles to SASS for sm_90 and holds every entry the ops launch.
TEST(CudaCodegen, TheBuiltinKernelsCompileWithEveryEntry) {
  const KernelSource& k = builtin_kernels();
  const CompiledCode ptx = nvrtc_compile(k.name, k.source, kArch, CodeKind::ptx, {});
  const std::string text(ptx.bytes.data());
  int entries = 0;
  for (const char* const* e = builtin_kernel_entries(); *e; ++e, ++entries)
    EXPECT_NE(text.find(std::string(".entry ").append(*e)), std::string::npos) << *e;
  EXPECT_EQ(entries, 12);
  EXPECT_FALSE(nvrtc_compile(k.name, k.source, kArch, CodeKind::cubin, {}).bytes.empty());
}

// Every op has a CUDA kernel but views (no kernel anywhere) and the collectives (NCCL is not
// there yet), and what each takes
// is what the CPU's takes in the op harness's dtypes.
TEST(CudaCodegen, EveryOpButTheCollectivesHasACudaKernel) {
  const KernelTable& table = cuda_kernels();
  std::vector<std::string> missing;
  for (const std::string& op : op_names())
    if (!table.count(op) && !op_def(op).view && op != "all_reduce" && op != "all_gather") missing.push_back(op);
  EXPECT_TRUE(missing.empty()) << "no CUDA kernel for " << testing::PrintToString(missing);
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    EXPECT_TRUE(table.at("linear").takes({{{2, 4}, t}, {{3, 4}, t}}));
    EXPECT_TRUE(table.at("sdpa").takes({{{1, 2, 3, 4}, t}, {{1, 2, 3, 4}, t}, {{1, 2, 3, 4}, t}}));
    EXPECT_TRUE(table.at("layer_norm").takes({{{2, 4}, t}}));
  }
  EXPECT_FALSE(table.at("linear").takes({{{2, 4}, DType::bf16}, {{3, 4}, DType::q8_0}})) << "no quantized GEMM yet";
  EXPECT_FALSE(table.at("add").takes({{{2}, DType::f8_e4m3}, {{2}, DType::f32}}));
  // matmul batches by strides: whole-batch broadcasts only, refused before anything is queued.
  const auto mm = [&](Shape a, Shape b) { return table.at("matmul").takes({{a, DType::bf16}, {b, DType::bf16}}); };
  EXPECT_TRUE(mm({2, 3, 4, 5}, {2, 3, 5, 6}));
  EXPECT_TRUE(mm({2, 3, 4, 5}, {5, 6}));
  EXPECT_TRUE(mm({1, 4, 5}, {7, 5, 6}));
  EXPECT_FALSE(mm({2, 1, 4, 5}, {1, 3, 5, 6}));
}

TEST(CudaCodegen, SassForSm90AndTheDiskCache) {
  const fs::path dir = fs::temp_directory_path() / std::string("kiln_nvrtc_cache_").append(std::to_string(::getpid()));
  fs::remove_all(dir);
  const KernelSource k = strided_copy_source(2);
  const CompiledCode first = nvrtc_compile(k.name, k.source, kArch, CodeKind::cubin, dir);
  EXPECT_FALSE(first.from_cache);
  ASSERT_GE(first.bytes.size(), 4u);
  EXPECT_EQ(std::string(first.bytes.data() + 1, 3), "ELF") << "a CUBIN is an ELF image";
  const CompiledCode second = nvrtc_compile(k.name, k.source, kArch, CodeKind::cubin, dir);
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(second.bytes, first.bytes);
  // Another architecture is another entry.
  EXPECT_FALSE(nvrtc_compile(k.name, k.source, 80, CodeKind::cubin, dir).from_cache);
  fs::remove_all(dir);
}

TEST(CudaCodegen, BadProgramsAndDtypesAreRefused) {
  FusedProgram bad;
  bad.instrs = {load(0), binary(BinaryOp::add, 0, 5)};
  bad.result = 1;
  test::expect_error([&] { fused_kernel_source(bad, {DType::f32}, DType::f32); }, {"[fused]"});
  FusedProgram p;
  p.instrs = {load(0)};
  p.result = 0;
  test::expect_error([&] { fused_kernel_source(p, {DType::f8_e4m3}, DType::f32); },
                     {"[fused]", "cannot load f8_e4m3"});
  test::expect_error([&] { strided_copy_source(3); }, {"[copy]", "3-byte elements"});
  // NVRTC's log reaches the error.
  test::expect_error([] { nvrtc_compile("broken", "extern \"C\" __global__ void broken() { undeclared(); }", kArch, CodeKind::ptx, {}); },
                     {"[nvrtc] broken", "undeclared"});
}

}  // namespace
}  // namespace kiln::cuda
