#include "exec/executable_store.h"

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <bit>
#include <fstream>
#include <atomic>
#include <mutex>
#include <thread>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include "core/cache_dir.h"
#include "core/error.h"
#include "io/input_file.h"
#include "graph/passes.h"

namespace kiln {

namespace {

using json = nlohmann::json;

constexpr const char* kMagic = "kiln-executable";

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// ---- graph ----

json attrs_to_json(const Attrs& a) {
  json out = json::array();
  for (const auto& [name, value] : a.items()) {
    json v;
    if (const auto* i = std::get_if<int64_t>(&value)) v = {{"i", *i}};
    else if (const auto* d = std::get_if<double>(&value)) v = {{"d", std::bit_cast<uint64_t>(*d)}};
    else if (const auto* l = std::get_if<std::vector<int64_t>>(&value)) v = {{"l", *l}};
    else v = {{"s", std::get<std::string>(value)}};
    out.push_back({name, v});
  }
  return out;
}

Attrs attrs_from_json(const json& j) {
  Attrs a;
  for (const json& item : j) {
    const std::string name = item.at(0).get<std::string>();
    const json& v = item.at(1);
    if (v.contains("i")) a.set(name, v.at("i").get<int64_t>());
    else if (v.contains("d")) a.set(name, std::bit_cast<double>(v.at("d").get<uint64_t>()));
    else if (v.contains("l")) a.set(name, v.at("l").get<std::vector<int64_t>>());
    else a.set(name, v.at("s").get<std::string>());
  }
  return a;
}

DType dtype_from(const json& j) {
  const int d = j.get<int>();
  KILN_CHECK(d >= 0 && d <= int(DType::boolean), "compile-cache", "unknown dtype ", d);
  return DType(d);
}

json graph_to_json(const Graph& g) {
  json in = json::array(), nodes = json::array();
  for (const GraphInput& i : g.inputs) in.push_back({{"shape", i.shape}, {"dtype", int(i.dtype)}, {"strides", i.strides}});
  for (const GraphNode& n : g.nodes)
    nodes.push_back({{"op", n.op}, {"attrs", attrs_to_json(n.attrs)}, {"args", n.args}, {"shape", n.shape},
                     {"dtype", int(n.dtype)}});
  return {{"device", g.device.str()}, {"inputs", in}, {"nodes", nodes}, {"outputs", g.outputs}};
}

Graph graph_from_json(const json& j) {
  Graph g;
  g.device = Device::parse(j.at("device").get<std::string>());
  for (const json& i : j.at("inputs"))
    g.inputs.push_back(GraphInput{i.at("shape").get<Shape>(), dtype_from(i.at("dtype")), i.at("strides").get<Strides>()});
  for (const json& n : j.at("nodes")) {
    GraphNode gn;
    gn.op = n.at("op").get<std::string>();
    gn.attrs = attrs_from_json(n.at("attrs"));
    gn.args = n.at("args").get<std::vector<int>>();
    gn.shape = n.at("shape").get<Shape>();
    gn.dtype = dtype_from(n.at("dtype"));
    g.nodes.push_back(std::move(gn));
  }
  g.outputs = j.at("outputs").get<std::vector<int>>();
  return g;
}

// ---- launch groups ----

json program_to_json(const FusedProgram& p) {
  json instrs = json::array();
  for (const FusedInstr& i : p.instrs)
    instrs.push_back({int(i.kind), i.input, int(i.unary), std::bit_cast<uint32_t>(i.lo), std::bit_cast<uint32_t>(i.hi), int(i.binary), i.a, i.b, i.c,
                      int(i.dtype), std::bit_cast<uint64_t>(i.start), std::bit_cast<uint64_t>(i.step), i.count});
  return {{"instrs", instrs}, {"result", p.result}};
}

FusedProgram program_from_json(const json& j) {
  FusedProgram p;
  for (const json& i : j.at("instrs")) {
    FusedInstr f;
    f.kind = FusedInstr::Kind(i.at(0).get<int>());
    f.input = i.at(1).get<int>();
    f.unary = UnaryOp(i.at(2).get<int>());
    f.lo = std::bit_cast<float>(i.at(3).get<uint32_t>());
    f.hi = std::bit_cast<float>(i.at(4).get<uint32_t>());
    f.binary = BinaryOp(i.at(5).get<int>());
    f.a = i.at(6).get<int>();
    f.b = i.at(7).get<int>();
    f.c = i.at(8).get<int>();
    f.dtype = dtype_from(i.at(9));
    f.start = std::bit_cast<double>(i.at(10).get<uint64_t>());
    f.step = std::bit_cast<double>(i.at(11).get<uint64_t>());
    f.count = i.at(12).get<int64_t>();
    p.instrs.push_back(f);
  }
  p.result = j.at("result").get<int>();
  return p;
}

json groups_to_json(const std::vector<LaunchGroup>& groups) {
  json out = json::array();
  for (const LaunchGroup& g : groups)
    out.push_back({{"kind", int(g.kind)}, {"nodes", g.nodes}, {"result", g.result}, {"inputs", g.group_inputs},
                   {"program", program_to_json(g.program)}, {"chain", g.chain}, {"internal", g.internal},
                   {"into", g.into}, {"into_offset", g.into_offset}, {"into_strides", g.into_strides},
                   {"slice", {g.slice_axis, g.slice_begin, g.slice_len}}, {"batch", g.batch},
                   {"alias_base", g.alias_base}});
  return out;
}

// Groups of `g`, checked as run_graph will use them, so a damaged or foreign entry fails here
// and never in a kernel: every index in range, each launch reading only values produced before
// it, each kind's fields consistent with its node, concat slices inside their concat, every
// graph output produced.
std::vector<LaunchGroup> groups_from_json(const json& j, const Graph& g) {
  const auto check = [](bool ok, const char* what) { KILN_CHECK(ok, "compile-cache", what); };
  const auto value = [&](int v) {
    KILN_CHECK(v >= 0 && v < g.num_values(), "compile-cache", "value id ", v, " out of range");
    return v;
  };
  const auto node = [&](int n) {
    KILN_CHECK(n >= 0 && n < int(g.nodes.size()), "compile-cache", "node index ", n, " out of range");
    return n;
  };
  const auto bytes = [&](int v) { return int64_t(storage_bytes(g.dtype_of(v), numel(g.shape_of(v)))); };
  std::vector<char> ready(size_t(g.num_values()), 0), batched(size_t(g.num_values()), 0);
  for (int i = 0; i < g.num_inputs(); ++i) ready[size_t(i)] = 1;
  std::vector<LaunchGroup> out;
  for (const json& e : j) {
    LaunchGroup grp;
    const int kind = e.at("kind").get<int>();
    KILN_CHECK(kind >= 0 && kind <= int(LaunchGroup::Kind::batched), "compile-cache", "unknown launch kind ", kind);
    grp.kind = LaunchGroup::Kind(kind);
    for (int n : e.at("nodes").get<std::vector<int>>()) grp.nodes.push_back(node(n));
    grp.result = value(e.at("result").get<int>());
    check(!g.is_input(grp.result) && !ready[size_t(grp.result)] &&
              (grp.kind == LaunchGroup::Kind::batched) == bool(batched[size_t(grp.result)]),
          "a launch result is a graph input or produced twice");
    const GraphNode& rnode = g.nodes[size_t(g.node_of(grp.result))];
    for (int v : e.at("inputs").get<std::vector<int>>()) grp.group_inputs.push_back(value(v));
    grp.program = program_from_json(e.at("program"));
    for (int n : e.at("chain").get<std::vector<int>>()) grp.chain.push_back(node(n));
    for (int v : e.at("internal").get<std::vector<int>>()) grp.internal.push_back(value(v));
    grp.into = e.at("into").get<int>();
    grp.into_offset = e.at("into_offset").get<int64_t>();
    grp.into_strides = e.at("into_strides").get<std::vector<int64_t>>();
    const auto slice = e.at("slice").get<std::vector<int64_t>>();
    check(slice.size() == 3, "a malformed slice");
    grp.slice_axis = int(slice[0]);
    grp.slice_begin = slice[1];
    grp.slice_len = slice[2];
    for (int v : e.at("batch").get<std::vector<int>>()) grp.batch.push_back(value(v));
    grp.alias_base = e.at("alias_base").get<int>();
    check(grp.alias_base < 0 || (grp.kind == LaunchGroup::Kind::alias && value(grp.alias_base) >= 0),
          "an alias base on a launch that is not an alias");
    const auto is_internal = [&](int v) {
      return std::find(grp.internal.begin(), grp.internal.end(), v) != grp.internal.end();
    };
    // A sliced epilogue's loaded views span its consumer's whole output (it reads its rows through
    // them, checked below); every other internal value lies inside the launch's own output.
    for (int v : grp.internal) {
      const bool loaded_view = grp.slice_axis >= 0 && grp.into >= 0 &&
                               std::find(grp.group_inputs.begin(), grp.group_inputs.end(), v) != grp.group_inputs.end();
      check(!g.is_input(v) && bytes(v) <= (loaded_view ? bytes(value(grp.into)) : bytes(grp.result)),
            "an internal value outside its output");
    }
    check(grp.batch.empty() || grp.kind == LaunchGroup::Kind::single_op, "a grouped launch that is not a linear");
    for (int v : grp.group_inputs) check(ready[size_t(v)] || is_internal(v), "a launch reads a value not produced yet");
    switch (grp.kind) {
      case LaunchGroup::Kind::view:
        check(rnode.op == "view" && grp.group_inputs.size() == 1 && grp.group_inputs[0] == rnode.args.at(0),
              "a view launch that does not match its node");
        break;
      case LaunchGroup::Kind::alias:
        check(grp.alias_base >= 0 && value(grp.alias_base) >= 0 && ready[size_t(grp.alias_base)] &&
                  bytes(grp.alias_base) == bytes(grp.result),
              "an alias without a computed base of its size");
        break;
      case LaunchGroup::Kind::assembled:
        check(rnode.op == "concat" || rnode.op == "copy" || is_fusable_op(rnode.op),
              "an assembled launch that is not a concat, copy or elementwise op");
        break;
      case LaunchGroup::Kind::single_op:
        check(grp.group_inputs == rnode.args && grp.chain.empty(), "a single-op launch whose inputs are not its node's");
        // A grouped launch: single-row linears of one row, each computed once, their weights ready.
        for (int v : grp.batch) {
          check(!g.is_input(v) && !ready[size_t(v)] && !batched[size_t(v)], "a grouped linear computed twice");
          const GraphNode& lin = g.nodes[size_t(g.node_of(v))];
          check(rnode.op == "linear" && lin.op == "linear" && lin.args.at(0) == rnode.args.at(0) &&
                    numel(rnode.shape) == rnode.shape.back() && numel(lin.shape) == lin.shape.back() &&
                    grp.into < 0,
                "a grouped launch of linears that do not read one row");
          for (int a : lin.args) check(ready[size_t(a)], "a grouped linear reading a value not produced yet");
          batched[size_t(v)] = 1;
        }
        break;
      case LaunchGroup::Kind::batched:
        check(batched[size_t(grp.result)] && grp.chain.empty() && grp.into < 0, "a batched linear no launch computes");
        break;
      case LaunchGroup::Kind::fused_elementwise:
        check(!grp.program.instrs.empty(), "a fused launch without a program");
        validate_fused_program(grp.program, grp.group_inputs.size());
        break;
      case LaunchGroup::Kind::epilogue:
        check(!grp.chain.empty(), "an epilogue launch without its chain");
        for (int n : grp.chain)
          for (int a : g.nodes[size_t(n)].args)
            check(ready[size_t(a)] || is_internal(a), "an epilogue chain reads a value not produced yet");
        if (!grp.program.instrs.empty()) validate_fused_program(grp.program, grp.group_inputs.size());
        break;
    }
    if (grp.slice_axis >= 0) {  // rows of an elementwise consumer, rewritten by the program
      value(grp.into);
      check(grp.kind == LaunchGroup::Kind::epilogue && !grp.program.instrs.empty() && grp.into_strides.empty() &&
                !g.is_input(grp.into) && is_fusable_op(g.nodes[size_t(g.node_of(grp.into))].op) &&
                g.dtype_of(grp.into) == rnode.dtype,
            "a sliced epilogue that does not write an elementwise consumer");
      const Shape& whole = g.shape_of(grp.into);
      check(size_t(grp.slice_axis) < whole.size() && grp.slice_begin >= 0 && grp.slice_len >= 0 &&
                grp.slice_begin + grp.slice_len <= whole[size_t(grp.slice_axis)],
            "a slice outside its consumer");
      int64_t row = 1;
      for (size_t d = size_t(grp.slice_axis) + 1; d < whole.size(); ++d) row *= whole[d];
      for (int64_t d = 0; d < grp.slice_axis; ++d) check(whole[size_t(d)] == 1, "a slice that is not dense");
      check(grp.into_offset == grp.slice_begin * row && numel(rnode.shape) == grp.slice_len * row,
            "a sliced epilogue whose chain does not fill its rows");
      // A proper slice cuts rows before the last dim (the loaded views permute within it) and
      // cannot hold an index computation (which is not cut); every other input broadcasts to whole.
      const bool proper = grp.slice_begin != 0 || grp.slice_len != whole[size_t(grp.slice_axis)];
      check(!proper || (size_t(grp.slice_axis) + 1 < whole.size() && !grp.program.has_iota()),
            "a slice across the rows it permutes");
      for (int v : grp.group_inputs) {
        if (std::find(grp.internal.begin(), grp.internal.end(), v) != grp.internal.end()) continue;
        check(broadcasts_to(g.shape_of(v), whole), "a sliced epilogue input that does not broadcast to its rows");
      }
      for (int v : grp.internal) {  // what the program loads from the chain's rows: views in whole's shape
        const bool loaded = std::find(grp.group_inputs.begin(), grp.group_inputs.end(), v) != grp.group_inputs.end();
        const int vn = g.node_of(v);
        check(!loaded || (vn >= 0 && is_row_local_view(g.nodes[size_t(vn)], whole)),
              "a sliced epilogue loading a value that is not a view of its rows");
      }
    } else if (grp.into >= 0 && grp.into_strides.empty()) {
      value(grp.into);
      check(!g.is_input(grp.into) && g.nodes[size_t(g.node_of(grp.into))].op == "concat" &&
                g.dtype_of(grp.into) == rnode.dtype && grp.into_offset >= 0 &&
                grp.into_offset + numel(rnode.shape) <= numel(g.shape_of(grp.into)),
            "a launch writing outside the concat it writes into");
    } else if (grp.into >= 0) {  // a transposed write: sdpa into the copy of its permuted view
      value(grp.into);
      check(grp.kind == LaunchGroup::Kind::single_op && rnode.op == "sdpa" &&
                (rnode.dtype == DType::f32 || rnode.dtype == DType::bf16) && !g.is_input(grp.into) &&
                g.nodes[size_t(g.node_of(grp.into))].op == "copy" && g.dtype_of(grp.into) == rnode.dtype &&
                grp.into_offset == 0 &&
                grp.into_strides.size() == rnode.shape.size() && grp.into_strides.back() == 1,
            "a transposed write that does not fit its copy");
      int64_t last = 0;  // the highest element written must lie inside the copy
      std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims stepped along
      for (size_t d = 0; d < rnode.shape.size(); ++d) {
        check(grp.into_strides[d] >= 0, "a transposed write with a negative stride");
        last += (rnode.shape[d] - 1) * grp.into_strides[d];
        if (rnode.shape[d] > 1) dims.emplace_back(grp.into_strides[d], rnode.shape[d]);
      }
      check(numel(rnode.shape) == numel(g.shape_of(grp.into)) && last < numel(g.shape_of(grp.into)),
            "a transposed write outside the copy it writes into");
      // No two elements at one place: each dim steps over everything the finer dims span.
      std::sort(dims.begin(), dims.end());
      for (size_t i = 1; i < dims.size(); ++i)
        check(dims[i].first >= dims[i - 1].first * dims[i - 1].second, "a transposed write whose elements overlap");
    } else {
      check(grp.into_strides.empty(), "strides without a buffer to write into");
    }
    ready[size_t(grp.result)] = 1;
    for (int v : grp.internal) ready[size_t(v)] = 1;
    out.push_back(std::move(grp));
  }
  for (int o : g.outputs) check(ready[size_t(o)], "a graph output no launch produces");
  return out;
}

std::string key_text(const Graph& canonical) {
  const FusionLimits lim;
  std::ostringstream os;
  os << kMagic << " format " << kExecutableFormatVersion << " graph-format " << kGraphFormatVersion << " engine "
     << KILN_VERSION << " cpu " << cpu_features() << " fusion " << lim.max_inputs << "/" << lim.max_depth << "/"
     << lim.max_nodes << " graph " << hex(fingerprint(canonical));
  return os.str();
}

}  // namespace

namespace {
std::mutex g_dir_mu;
std::optional<std::filesystem::path>& dir_override() {
  static std::optional<std::filesystem::path> d;
  return d;
}
}  // namespace

void set_executable_cache_dir(const std::filesystem::path& dir) {
  std::lock_guard<std::mutex> lock(g_dir_mu);
  dir_override() = dir;
}

std::filesystem::path executable_cache_dir() {
  {
    std::lock_guard<std::mutex> lock(g_dir_mu);
    if (dir_override()) return *dir_override();
  }
  return cache_dir();
}

std::string cpu_features() {
  std::string s;
#if defined(__x86_64__)
  s = "x86_64";
  __builtin_cpu_init();
#define KILN_FEATURE(name) \
  if (__builtin_cpu_supports(name)) s += std::string(" ") + name;
  KILN_FEATURE("avx2")
  KILN_FEATURE("fma")
  KILN_FEATURE("avx512f")
  KILN_FEATURE("avx512bw")
  KILN_FEATURE("avx512vl")
  KILN_FEATURE("avx512vnni")
  KILN_FEATURE("avx512bf16")
#undef KILN_FEATURE
#elif defined(__aarch64__)
  s = "aarch64";
#else
  s = "unknown";
#endif
  return s;
}

std::filesystem::path executable_path(const std::filesystem::path& dir, const Graph& canonical) {
  return dir / (hex(fnv1a(key_text(canonical))) + ".kexe");
}

std::shared_ptr<const CompiledGraph> load_executable(const std::filesystem::path& dir, const Graph& canonical,
                                                     std::string* rejected) {
  const std::filesystem::path path = executable_path(dir, canonical);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return nullptr;  // not compiled yet
  std::string text;
  try {
    // Never a blocking open: a FIFO planted in the cache is rejected (io/input_file.h).
    text = io::read_input_file("compile-cache", path, "a compiled executable (.kexe)");
    // First line: checksum of the rest.
    const size_t nl = text.find('\n');
    KILN_CHECK(nl != std::string::npos, "compile-cache", "no header line");
    const std::string body = text.substr(nl + 1);
    KILN_CHECK(text.substr(0, nl) == hex(fnv1a(body)), "compile-cache", "checksum mismatch (damaged or truncated)");
    const json j = json::parse(body);
    KILN_CHECK(j.at("key").get<std::string>() == key_text(canonical), "compile-cache",
               "written for another engine, CPU or graph: ", j.at("key").get<std::string>());
    Graph stored = graph_from_json(j.at("graph"));
    KILN_CHECK(same_structure(stored, canonical), "compile-cache", "its graph differs from the traced one");
    std::vector<LaunchGroup> groups = groups_from_json(j.at("groups"), stored);
    return finish_compiled_graph(std::move(stored), std::move(groups), /*plan_memory=*/true);
  } catch (const std::exception& e) {
    if (rejected) *rejected = path.string() + ": " + e.what();
    return nullptr;
  }
}

std::string store_executable(const std::filesystem::path& dir, const CompiledGraph& compiled) {
  const std::filesystem::path path = executable_path(dir, compiled.graph);
  try {
    std::filesystem::create_directories(dir);
    const json j = {{"key", key_text(compiled.graph)},
                    {"graph", graph_to_json(compiled.graph)},
                    {"groups", groups_to_json(compiled.groups)}};
    const std::string body = j.dump();
    // Unique per writer (process, thread, call), so concurrent writers never share a temp file.
    static std::atomic<uint64_t> counter{0};
    const std::filesystem::path tmp = path.string() + ".tmp." + std::to_string(::getpid()) + "." +
                                      std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id())) + "." +
                                      std::to_string(counter.fetch_add(1));
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << hex(fnv1a(body)) << '\n' << body;
      out.close();
      if (!out) {
        std::error_code ec;
        std::filesystem::remove(tmp, ec);
        return "cannot write " + tmp.string();
      }
    }
    std::filesystem::rename(tmp, path);  // first complete writer wins; readers never see a partial file
  } catch (const std::exception& e) {
    return path.string() + ": " + e.what();
  }
  return {};
}

}  // namespace kiln
