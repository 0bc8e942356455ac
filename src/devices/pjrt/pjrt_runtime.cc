// The PJRT device. Its memory is the plugin's: each kiln buffer is one device buffer of raw bytes
// (u8[bytes]), found from the address kiln's tensors carry — an address in a range no host memory
// uses, never dereferenced, only looked up (like a CUDA device pointer). A write replaces a
// buffer's device buffer with the program's result (PJRT buffers are immutable values); a write
// into part of a buffer updates it in place through input-output aliasing.
//
// Programs (programs.h): strict eager compiles one executable per op, shapes, dtypes and layouts,
// cached; deferred and compiled mode hand it whole graphs (runs_whole_graphs), one executable
// each. Executables are kept for the process and, serialized, in the on-disk cache keyed by the
// plugin's platform and version and the device they were compiled for.
//
// Tensor parallelism: the ranks are threads of this process, rank r on device pjrt:first+r
// (distributed/local_ranks.h). A program with collectives (an all_reduce or all_gather op, or a
// graph holding one) is compiled once for all ranks' devices, one replica each, and run once:
// every rank hands its arguments to rank 0 through its in-process group, rank 0 runs the
// replicas, and each rank takes its own results. Every other program runs on the rank's own
// device alone. The queue: enqueue runs its work at once; the work calls into
// the plugin, which runs asynchronously, and the item's sequence number stands for the events of
// what it started, which wait_for awaits.
#include "devices/pjrt/pjrt_runtime.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "core/env.h"
#include "core/error.h"
#include "core/tensor.h"
#include "devices/copy_check.h"
#include "devices/kernel_times.h"
#include "devices/pjrt/disk_cache.h"
#include "devices/pjrt/lower_ops.h"
#include "devices/pjrt/plugin.h"
#include "devices/pjrt/programs.h"
#include "distributed/process_group.h"
#include "graph/graph.h"
#include "graph/op.h"

#ifndef KILN_PJRT_CPU_PLUGIN
#define KILN_PJRT_CPU_PLUGIN ""
#endif

namespace kiln::pjrt {

namespace {

// Device addresses start far above any host mapping and never reach it: 2^46 bytes apart from
// host memory's usual range, handed out once each.
constexpr uintptr_t kAddressBase = uintptr_t(1) << 46;
constexpr size_t kAddressAlign = 256;
constexpr size_t kMaxOps = 128;

const std::vector<std::string>& ops_by_index() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n = op_names();
    KILN_CHECK(n.size() <= kMaxOps, "pjrt", n.size(), " ops are registered, the PJRT device dispatches ", kMaxOps);
    return n;
  }();
  return names;
}

class PjrtRuntime;
thread_local PjrtRuntime* t_current = nullptr;

bool is_collective(const std::string& op) { return op == "all_reduce" || op == "all_gather"; }

// Executables compiled for several devices at once, shared by the runtimes of one client (each
// rank asks for the one they all run).
struct ReplicatedPrograms {
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<Executable>> loaded;
};

void run_on_current(size_t op, const KernelArgs& args);

template <size_t I>
void trampoline(const KernelArgs& args) {
  run_on_current(I, args);
}
template <size_t... I>
constexpr std::array<KernelFn, sizeof...(I)> make_trampolines(std::index_sequence<I...>) {
  return {&trampoline<I>...};
}
// KernelFn carries no op: kernel(op) hands out the trampoline of the op's registry index.
constexpr auto kTrampolines = make_trampolines(std::make_index_sequence<kMaxOps>{});

class PjrtRuntime final : public DeviceRuntime {
 public:
  PjrtRuntime(DeviceType type, int index, std::shared_ptr<Client> client,
              std::shared_ptr<ReplicatedPrograms> replicated)
      : type_(type), index_(index), client_(std::move(client)), replicated_(std::move(replicated)) {
    KILN_CHECK(index >= 0 && index < client_->device_count(), "device", Device{type, index}.str(),
               " is not available: the plugin ", client_->path(), " has ", client_->device_count(), " device",
               client_->device_count() == 1 ? "" : "s",
               type == DeviceType::pjrt ? " (XLA's CPU plugin makes KILN_PJRT_CPU_DEVICES of them, 4 by default)" : "");
    platform_ = client_->platform_name() + " " + client_->api_version() + " " + client_->platform_version();
  }

  Device device() const override { return Device{type_, index_}; }
  bool is_host() const override { return false; }

  // ---- memory ----
  BufferPtr allocate(size_t bytes) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (capacity_ != 0 && in_use_ + bytes > capacity_)
      fail("alloc", "out of memory on ", device().str(), ": requested ", bytes, " bytes, available ",
           capacity_ - std::min(capacity_, in_use_), " of capacity ", capacity_, " bytes (", in_use_, " in use)");
    const uintptr_t address = next_address_;
    next_address_ += (std::max<size_t>(bytes, 1) + kAddressAlign - 1) / kAddressAlign * kAddressAlign;
    slots_.emplace(address, Slot{bytes, nullptr});
    in_use_ += bytes;
    peak_ = std::max(peak_, in_use_);
    ++allocations_;
    return std::make_shared<Buffer>(reinterpret_cast<void*>(address), bytes, device(), [this, address] {
      std::lock_guard<std::recursive_mutex> l(mu_);
      auto it = slots_.find(address);
      if (it == slots_.end()) return;
      in_use_ -= it->second.bytes;
      slots_.erase(it);
    });
  }
  MemoryStats memory() const override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    MemoryStats s;
    s.in_use_bytes = in_use_;
    s.peak_bytes = peak_;
    s.capacity_bytes = capacity_;
    s.allocations = allocations_;
    s.reserved_peak_bytes = peak_;
    return s;
  }
  void set_memory_capacity(size_t bytes) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    capacity_ = bytes;
  }
  void reset_peak_memory() override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    peak_ = in_use_;
  }
  void release_cached_memory() override {}
  size_t allocation_size(size_t bytes) const override { return bytes; }
  // The device's own memory where the plugin reports it (a GPU's or TPU's), so the fail-fast
  // memory check of a call compares against it; unknown (0) on XLA's CPU plugin.
  size_t physical_available_bytes() const override {
    const auto m = client_->memory_stats(index_);
    return m && m->limit > m->in_use ? size_t(m->limit - m->in_use) : 0;
  }
  size_t physical_total_bytes() const override {
    const auto m = client_->memory_stats(index_);
    return m ? size_t(m->limit) : 0;
  }

  // ---- queue ----
  uint64_t enqueue(std::string what, std::function<void()> work, size_t) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    const auto t0 = std::chrono::steady_clock::now();
    PjrtRuntime* previous = t_current;
    t_current = this;
    std::vector<Event> events;
    std::swap(events, item_events_);
    try {
      work();
    } catch (...) {
      t_current = previous;
      std::swap(events, item_events_);
      throw;
    }
    t_current = previous;
    std::swap(events, item_events_);
    times_.add(what, std::chrono::steady_clock::now() - t0);
    return record_locked(std::move(events), {});
  }
  void wait_for(uint64_t seq) override {
    std::unique_lock<std::recursive_mutex> lock(mu_);
    while (!pending_.empty() && pending_.front().seq <= seq) {
      Pending item = std::move(pending_.front());
      pending_.pop_front();
      for (const Event& e : item.events) client_->await(e, "a queued program or copy");
      completed_ = std::max(completed_, item.seq);
    }
  }
  uint64_t last_enqueued() const override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return last_;
  }
  uint64_t completed() const override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    while (!pending_.empty()) {
      bool ready = true;
      for (const Event& e : pending_.front().events) ready = ready && client_->is_ready(e);
      if (!ready) break;
      completed_ = pending_.front().seq;
      pending_.pop_front();
    }
    return pending_.empty() ? last_ : completed_;
  }
  // The plugin frees a device buffer once the programs reading it have run: a buffer the host
  // drops is as good as free, whatever is still queued.
  size_t max_in_flight() const override { return 1; }
  size_t max_in_flight_bytes() const override { return ~size_t{0}; }

  // ---- copies ----
  uint64_t copy(const BufferPtr& src, size_t src_offset, const BufferPtr& dst, size_t dst_offset,
                size_t bytes) override {
    const auto [from_host, to_host] = check_copy(device(), src, src_offset, dst, dst_offset, bytes);
    std::lock_guard<std::recursive_mutex> lock(mu_);
    times_.count("transfer");
    std::vector<Event> events;
    std::vector<std::shared_ptr<void>> held{src, dst};
    if (bytes == 0) return record_locked({}, std::move(held));
    if (from_host && to_host) {
      wait_for(last_);
      std::memcpy(static_cast<char*>(dst->data()) + dst_offset, static_cast<const char*>(src->data()) + src_offset, bytes);
    } else if (from_host) {
      Slot& to = slot_at(dst->data());
      auto [uploaded, done] = client_->upload(static_cast<const char*>(src->data()) + src_offset, bytes, index_);
      events.push_back(done);
      if (dst_offset == 0 && bytes == to.bytes) {
        to.handle = uploaded;
      } else {
        held.push_back(uploaded);
        write_part(to, dst_offset, uploaded, bytes, 0, bytes, events);
      }
    } else if (to_host) {
      Slot& from = slot_at(src->data());
      char* out = static_cast<char*>(dst->data()) + dst_offset;
      if (!from.handle) {
        wait_for(last_);
        std::memset(out, 0, bytes);  // never written: zeros, as a fresh device buffer reads
      } else {
        held.push_back(from.handle);
        events.push_back(client_->download(from.handle.get(), out, src_offset, bytes));
      }
    } else {
      Slot& from = slot_at(src->data());
      Slot& to = slot_at(dst->data());
      ensure_written(from);
      if (src_offset == 0 && dst_offset == 0 && bytes == from.bytes && bytes == to.bytes) {
        to.handle = from.handle;  // device buffers are values: both slots may hold one
      } else {
        const DeviceBuffer source = from.handle;
        write_part(to, dst_offset, source, from.bytes, src_offset, bytes, events);
      }
    }
    return record_locked(std::move(events), std::move(held));
  }

  std::map<std::string, std::pair<double, uint64_t>> kernel_times() const override { return times_.snapshot(); }
  void reset_kernel_times() override { times_.reset(); }

  // ---- kernels: one program per op, shapes, dtypes and layouts ----
  KernelFn kernel(const std::string& op) const override {
    const auto& ops = ops_by_index();
    const auto it = std::find(ops.begin(), ops.end(), op);
    return it == ops.end() ? nullptr : kTrampolines[size_t(it - ops.begin())];
  }
  bool supports(const std::string& op, const std::vector<OperandMeta>& inputs) const override {
    std::string why;
    return kernel(op) != nullptr && lowerable(op, inputs, &why);
  }
  void fused_elementwise(const FusedProgram&, const std::vector<TensorView>&, const TensorView&) const override {
    fail("pjrt", device().str(), " runs deferred graphs whole (XLA fuses them), not kiln's fused programs");
  }
  void grouped_linear_rows(const std::vector<KernelArgs>& linears) const override {
    const KernelFn linear = kernel("linear");
    for (const KernelArgs& args : linears) linear(args);
  }

  void run_kernel(size_t op_index, const KernelArgs& args) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    OpProgramSpec spec;
    spec.op = ops_by_index()[op_index];
    spec.attrs = args.attrs ? *args.attrs : Attrs{};
    std::vector<uintptr_t> bases;
    auto view_of = [&](const TensorView& t) {
      auto [base, slot] = find_slot(t.data);
      size_t arg = std::find(bases.begin(), bases.end(), base) - bases.begin();
      if (arg == bases.size()) {
        bases.push_back(base);
        spec.arg_bytes.push_back(slot->bytes);
      }
      return ByteView{int(arg), int64_t(reinterpret_cast<uintptr_t>(t.data) - base), t.shape, t.strides, t.dtype};
    };
    for (const TensorView& t : args.in) spec.inputs.push_back(view_of(t));
    auto [out_base, out_slot] = find_slot(args.out.data);
    const size_t out_bytes = size_t(args.out.numel()) * dtype_size(args.out.dtype);
    KILN_CHECK(args.out.strides == contiguous_strides(args.out.shape), "pjrt", spec.op,
               " writes a strided output view; PJRT programs write dense results");
    if (reinterpret_cast<uintptr_t>(args.out.data) == out_base && out_bytes == out_slot->bytes) {
      spec.out = ByteView{-1, 0, args.out.shape, args.out.strides, args.out.dtype};
      spec.out_bytes = out_slot->bytes;
    } else {
      spec.out = view_of(args.out);
    }
    // Everything the program depends on: the op, its attributes, the buffers' sizes, each view.
    std::ostringstream key;
    key << spec.op << '|' << spec.attrs.str();
    for (size_t b : spec.arg_bytes) key << '|' << b;
    auto describe_view = [&](const ByteView& v) {
      key << '|' << v.arg << ':' << v.byte_offset << to_string(v.shape) << to_string(v.strides) << dtype_name(v.dtype);
    };
    describe_view(spec.out);
    for (const ByteView& v : spec.inputs) describe_view(v);
    key << '|' << spec.out_bytes;
    // A collective among several ranks is one program over all their devices; it writes a fresh
    // buffer, so nothing is donated.
    spec.replicas = is_collective(spec.op) ? ProcessGroup::world()->size() : 1;
    std::vector<PJRT_Buffer*> inputs;
    std::vector<bool> donated(bases.size(), false);
    std::vector<DeviceBuffer> keep;
    for (size_t i = 0; i < bases.size(); ++i) {
      Slot& s = slots_.at(bases[i]);
      ensure_written(s);
      inputs.push_back(s.handle.get());
      keep.push_back(s.handle);
    }
    if (spec.out.arg >= 0 && spec.replicas == 1) {
      // Updated in place when only this buffer holds its device buffer (else XLA copies it).
      donated[size_t(spec.out.arg)] = keep[size_t(spec.out.arg)].use_count() <= 2;
    }
    keep.clear();
    std::vector<DeviceBuffer> outs =
        spec.replicas > 1
            ? run_with_other_ranks(op_program(spec), spec.op, inputs)
            : client_->execute(*program(key.str(), spec.op, [&] { return op_program(spec); }), inputs, donated);
    ++counters_.executed;
    out_slot->handle = outs.at(0);
    item_events_.push_back(client_->ready(outs[0].get()));
  }

  // ---- whole graphs (deferred and compiled mode) ----
  bool runs_whole_graphs() const override { return true; }
  bool runs_ranks_in_process() const override { return true; }
  std::vector<Tensor> run_whole_graph(const Graph& g, const std::vector<Tensor>& inputs) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    std::vector<uintptr_t> bases;
    std::vector<size_t> arg_bytes;
    std::vector<ByteView> views;
    for (const Tensor& t : inputs) {
      void* data = t.data_ptr();
      auto [base, slot] = find_slot(data);
      size_t arg = std::find(bases.begin(), bases.end(), base) - bases.begin();
      if (arg == bases.size()) {
        bases.push_back(base);
        arg_bytes.push_back(slot->bytes);
      }
      views.push_back(ByteView{int(arg), int64_t(reinterpret_cast<uintptr_t>(data) - base), t.shape(), t.strides(),
                               t.dtype()});
    }
    const bool collective =
        std::any_of(g.nodes.begin(), g.nodes.end(), [](const auto& n) { return is_collective(n.op); });
    const int ranks = collective ? ProcessGroup::world()->size() : 1;
    const std::string mlir = graph_program(g, arg_bytes, views, ranks);
    const std::shared_ptr<Executable> exe = ranks > 1 ? nullptr : program(mlir, "graph", [&] { return mlir; });
    std::vector<Tensor> results;
    std::vector<BufferPtr> buffers;
    for (int v : g.outputs) {
      const size_t bytes = size_t(numel(g.shape_of(v))) * dtype_size(g.dtype_of(v));
      buffers.push_back(allocate(bytes));
      results.push_back(Tensor::view_of(buffers.back(), g.shape_of(v), g.dtype_of(v)));
    }
    const uint64_t seq = enqueue("pjrt_graph", [&] {
      std::vector<PJRT_Buffer*> handles;
      for (uintptr_t base : bases) {
        Slot& s = slots_.at(base);
        ensure_written(s);
        handles.push_back(s.handle.get());
      }
      std::vector<DeviceBuffer> outs =
          exe ? client_->execute(*exe, handles, {}) : run_with_other_ranks(mlir, "graph", handles);
      ++counters_.executed;
      ++counters_.whole_graphs;
      for (size_t i = 0; i < outs.size(); ++i) {
        slot_at(buffers[i]->data()).handle = outs[i];
        item_events_.push_back(client_->ready(outs[i].get()));
      }
    }, 0);
    for (const BufferPtr& b : buffers) b->set_ready_seq(seq);
    return results;
  }

  std::map<std::string, uint64_t> device_counters() const override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return {{"programs_compiled", counters_.compiled},
            {"programs_loaded_from_disk", counters_.loaded_from_disk},
            {"programs_reused", counters_.reused},
            {"programs_executed", counters_.executed},
            {"whole_graphs_run", counters_.whole_graphs},
            {"programs_run_with_other_ranks", counters_.replicated}};
  }
  const std::string& platform() const { return platform_; }

 private:
  // What the programs cost so far: XLA compiles, executables read from the on-disk cache, found
  // loaded in this process, and executions (whole_graphs: of deferred or compiled graphs).
  struct ProgramCounters {
    uint64_t compiled = 0, loaded_from_disk = 0, reused = 0, executed = 0, whole_graphs = 0, replicated = 0;
  };
  struct Slot {
    size_t bytes = 0;
    DeviceBuffer handle;  // null until first written
  };
  struct Pending {
    uint64_t seq;
    std::vector<Event> events;
    std::vector<std::shared_ptr<void>> held;  // host memory and device buffers a transfer uses
  };

  std::pair<uintptr_t, Slot*> find_slot(const void* p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = slots_.upper_bound(a);
    KILN_CHECK(it != slots_.begin(), "pjrt", "address ", p, " is not memory of ", device().str());
    --it;
    KILN_CHECK(a <= it->first + it->second.bytes, "pjrt", "address ", p, " is not memory of ", device().str());
    return {it->first, &it->second};
  }
  Slot& slot_at(const void* p) { return *find_slot(p).second; }

  // A slot never written reads as zeros.
  void ensure_written(Slot& s) {
    if (s.handle) return;
    const std::string key = "zeros|" + std::to_string(s.bytes);
    const auto exe = program(key, "zeros", [&] { return zeros_program(s.bytes); });
    s.handle = client_->execute(*exe, {}, {}).at(0);
    ++counters_.executed;
  }

  // Writes `count` bytes at `src_offset` of device buffer `src` (`src_bytes` long) into `to` at
  // `dst_offset`: `to` is updated in place when nothing else holds its device buffer.
  void write_part(Slot& to, size_t dst_offset, const DeviceBuffer& src, size_t src_bytes, size_t src_offset,
                  size_t count, std::vector<Event>& events) {
    ensure_written(to);
    const std::string key = "copy|" + std::to_string(src_bytes) + "|" + std::to_string(src_offset) + "|" +
                            std::to_string(to.bytes) + "|" + std::to_string(dst_offset) + "|" + std::to_string(count);
    const auto exe = program(key, "copy", [&] { return copy_program(src_bytes, src_offset, to.bytes, dst_offset, count); });
    const bool donate = to.handle.use_count() == 1;
    std::vector<DeviceBuffer> outs = client_->execute(*exe, {src.get(), to.handle.get()}, {false, donate});
    ++counters_.executed;
    to.handle = outs.at(0);
    events.push_back(client_->ready(to.handle.get()));
  }

  // The executable for `key`: loaded in this process, else from the on-disk cache, else compiled.
  std::shared_ptr<Executable> program(const std::string& key, const std::string& name,
                                      const std::function<std::string()>& mlir) {
    auto it = programs_.find(key);
    if (it != programs_.end()) {
      ++counters_.reused;
      return it->second;
    }
    // Device 0's entries keep the key they always had; other devices' programs are their own.
    const std::shared_ptr<Executable> exe = load_or_compile(
        mlir(), name, index_ == 0 ? platform_ : platform_ + " device " + std::to_string(index_), index_, 1);
    programs_.emplace(key, exe);
    return exe;
  }

  // `text` compiled for `replicas` devices from `first`: from the on-disk cache (under `cache_key`
  // beside the text), else compiled and stored there.
  std::shared_ptr<Executable> load_or_compile(const std::string& text, const std::string& name,
                                              const std::string& cache_key, int first, int replicas) {
    const std::filesystem::path file = cache_file("pjrt", text, cache_key, ".pjrt");
    if (const std::optional<std::string> bytes = read_cache_file(file)) {
      try {
        std::shared_ptr<Executable> exe = client_->deserialize(name, *bytes);
        ++counters_.loaded_from_disk;
        return exe;
      } catch (const Error&) {
        // a damaged or foreign entry: compiled again and rewritten below
      }
    }
    std::shared_ptr<Executable> exe = client_->compile(name, text, first, replicas);
    ++counters_.compiled;
    store_cache_file(file, client_->serialize(*exe));
    return exe;
  }

  // The executable of `text` for `ranks` replicas on devices first..first+ranks-1, shared by every
  // rank's runtime: loaded, else from the on-disk cache, else compiled (by the first rank to ask).
  std::shared_ptr<Executable> replicated_program(const std::string& text, const std::string& name, int first,
                                                 int ranks) {
    const std::string devices = " devices " + std::to_string(first) + "+" + std::to_string(ranks);
    std::lock_guard<std::mutex> lock(replicated_->mu);
    auto it = replicated_->loaded.find(devices + "|" + text);
    if (it != replicated_->loaded.end()) {
      ++counters_.reused;
      return it->second;
    }
    const std::shared_ptr<Executable> exe = load_or_compile(text, name, platform_ + devices, first, ranks);
    replicated_->loaded.emplace(devices + "|" + text, exe);
    return exe;
  }

  // Runs `text`, a program with collectives, as one replica per rank of this thread's in-process
  // world (this rank's with `args`) and returns this rank's results. A collective over the ranks:
  // each calls it at the same point of the same work.
  std::vector<DeviceBuffer> run_with_other_ranks(const std::string& text, const std::string& name,
                                                 const std::vector<PJRT_Buffer*>& args) {
    ProcessGroup& world = *ProcessGroup::world();
    KILN_CHECK(world.in_process(), "pjrt", device().str(), " (", world.describe(), "): a PJRT program's collectives ",
               "join the devices of one process; run the ranks in one process (kiln generate --device ",
               Device{type_, 0}.str(), " --tp ", world.size(), ", without mpirun)");
    const int first = index_ - world.rank();
    const std::shared_ptr<Executable> exe = replicated_program(text, name, first, world.size());
    struct Part {
      const Executable* exe;
      int device;
      const std::vector<PJRT_Buffer*>* args;
      std::vector<DeviceBuffer> outs;
      std::string error;
    };
    Part mine{exe.get(), index_, &args, {}, {}};
    Part* me = &mine;
    std::vector<Part*> parts(size_t(world.size()));
    world.all_gather(&me, parts.data(), sizeof(Part*));
    if (world.rank() == 0) {
      try {
        std::vector<std::vector<PJRT_Buffer*>> all;
        for (int r = 0; r < world.size(); ++r) {
          const Part& p = *parts[size_t(r)];
          KILN_CHECK(p.device == first + r, "pjrt", "rank ", r, " runs on ", Device{type_, p.device}.str(),
                     ", expected ", Device{type_, first + r}.str(), ": rank r of a tensor-parallel world runs on the ",
                     "r-th device after rank 0's");
          KILN_CHECK(p.exe == exe.get(), "pjrt", "rank ", r, " ran another program than rank 0 at the same point (",
                     name, "): the ranks' work diverged");
          all.push_back(*p.args);
        }
        std::vector<std::vector<DeviceBuffer>> outs = client_->execute_replicas(*exe, all);
        for (int r = 0; r < world.size(); ++r) parts[size_t(r)]->outs = std::move(outs[size_t(r)]);
      } catch (const std::exception& e) {
        for (Part* p : parts) p->error = e.what();
      }
    }
    world.barrier();  // rank 0 has written every rank's results (or its error)
    if (!mine.error.empty()) throw Error(mine.error);
    ++counters_.replicated;
    return std::move(mine.outs);
  }

  uint64_t record_locked(std::vector<Event> events, std::vector<std::shared_ptr<void>> held) {
    pending_.push_back(Pending{++last_, std::move(events), std::move(held)});
    return last_;
  }

  DeviceType type_;
  int index_;
  std::shared_ptr<Client> client_;
  std::shared_ptr<ReplicatedPrograms> replicated_;
  std::string platform_;
  // Recursive: queued work calls back into the runtime (allocate, copy) on the same thread.
  mutable std::recursive_mutex mu_;
  std::map<uintptr_t, Slot> slots_;
  uintptr_t next_address_ = kAddressBase;
  size_t in_use_ = 0, peak_ = 0, capacity_ = 0;
  uint64_t allocations_ = 0;
  std::unordered_map<std::string, std::shared_ptr<Executable>> programs_;
  ProgramCounters counters_;
  std::vector<Event> item_events_;  // events of the queue item being enqueued
  uint64_t last_ = 0;
  mutable uint64_t completed_ = 0;
  mutable std::deque<Pending> pending_;
  KernelTimes times_;
};

void run_on_current(size_t op, const KernelArgs& args) {
  KILN_CHECK(t_current != nullptr, "pjrt", "a PJRT kernel ran outside its device's queue");
  t_current->run_kernel(op, args);
}

// KILN_PJRT_CPU_DEVICES: how many devices XLA's CPU plugin makes (its default, 4, when unset).
int cpu_plugin_devices() {
  const std::optional<uint64_t> n = env::positive_int("KILN_PJRT_CPU_DEVICES");
  KILN_CHECK(!n || *n <= 64, "device", "KILN_PJRT_CPU_DEVICES=", *n, ": expected 1 to 64 devices");
  return n ? int(*n) : 0;
}

PjrtRuntime& runtime_for_type(DeviceType type, int index) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, PjrtRuntime*> runtimes;  // never destroyed (plugins tear down at exit)
  static std::map<std::string, std::pair<std::shared_ptr<Client>, std::shared_ptr<ReplicatedPrograms>>> clients;
  std::lock_guard<std::mutex> lock(mu);
  auto& rt = runtimes[{int(type), index}];
  if (!rt) {
    std::string path = type == DeviceType::tpu ? tpu_plugin_path() : plugin_path();
    auto& [client, replicated] = clients[path];
    if (!client) {
      client = std::make_shared<Client>(path, type == DeviceType::pjrt ? cpu_plugin_devices() : 0);
      replicated = std::make_shared<ReplicatedPrograms>();
    }
    rt = new PjrtRuntime(type, index, client, replicated);
  }
  return *rt;
}

PjrtRuntime& pjrt_runtime(const Device& device) {
  KILN_CHECK(device.type == DeviceType::pjrt || device.type == DeviceType::tpu, "pjrt", device.str(),
             " is not a PJRT device");
  return runtime_for_type(device.type, device.index);
}

}  // namespace

DeviceRuntime& runtime_of(int index) { return runtime_for_type(DeviceType::pjrt, index); }
DeviceRuntime& tpu_runtime_of(int index) { return runtime_for_type(DeviceType::tpu, index); }

std::string plugin_path() { return env::text("KILN_PJRT_PLUGIN").value_or(KILN_PJRT_CPU_PLUGIN); }

std::string tpu_plugin_path() { return env::text("KILN_TPU_PLUGIN").value_or(KILN_LIBTPU_PLUGIN); }

std::string platform_of(const Device& device) { return pjrt_runtime(device).platform(); }

}  // namespace kiln::pjrt
