#include "report.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "devices/runtime.h"
#include "exec/compile.h"
#include "exec/counters.h"
#include "exec/executable_store.h"
#include "exec/deferred.h"
#include "exec/mode.h"
#include "exec/profile.h"
#include "io/output_file.h"
#include "io/safetensors.h"

namespace kiln::cli {

namespace {
std::string hex64(uint64_t v) {  // graph fingerprints as in KILN_DEFER_LOG
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}
}  // namespace


void write_report(const std::filesystem::path& file, nlohmann::json inputs, nlohmann::json timings,
                  nlohmann::json extra, const Device& device) {
  const Counters c = counters();
  const DeferredStats d = deferred_stats();
  nlohmann::json flushes = nlohmann::json::object();
  for (int i = 0; i < kNumFlushCauses; ++i) flushes[flush_cause_name(FlushCause(i))] = d.flushes[i];
  // One entry per graph compiled in this process (deferred mode: one per distinct fingerprint).
  nlohmann::json compiles = nlohmann::json::array();
  for (const GraphCacheEntryStats& e : d.entries) {
    compiles.push_back({{"kind", "deferred_graph"},
                        {"fingerprint", hex64(e.fingerprint)},
                        {"reason", "new graph fingerprint"},
                        {"seconds", e.compile_seconds},
                        {"nodes", e.nodes},
                        {"launches", e.launches},
                        {"runs", e.runs}});
  }
  const MemoryStats mem = runtime(device).memory();
  // The host's own figures (its bf16 linear path, its f32 conversions), whatever the device.
  const DeviceRuntime& host = runtime(Device::cpu());
  const auto host_counters = host.device_counters();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  nlohmann::json report{
      {"engine",
       {{"version", KILN_VERSION},
        {"device", device.str()},
        {"mode", eager_mode_name(eager_mode())},
        // How this CPU runs bf16 linears: bf16 dot products, or widened into the f32 GEMM where
        // those are slower.
        {"bf16_linear", host.device_settings().at("bf16_linear")},
        // Which copy of the CPU kernels runs: "native", or the x86-64 level a portable build chose.
        {"cpu_kernels", host.device_settings().at("cpu_kernels")}}},
      {"inputs", std::move(inputs)},
      {"timings", std::move(timings)},
      {"counters",
       {{"ops_dispatched", c.ops_dispatched},
        {"kernels_launched", c.kernels_launched},
        {"kernels_run", c.kernels_run},
        {"kernels_by_name", kernels_by_name()},
        {"graphs_compiled", d.cache_misses},
        {"cache_hits", d.cache_hits},
        {"cache_misses", d.cache_misses},
        {"compile_seconds", d.compile_seconds},
        {"graph_host_seconds", d.host_seconds},
        {"graphs_run", d.graphs_run},
        {"flushes", flushes},
        {"sync_points", c.sync_points},
        {"host_waits", c.host_waits},
        // Bytes of operands kernels had to convert to f32 copies (0 when every weight and
        // activation is read in its own dtype).
        {"f32_conversion_bytes", host_counters.at("f32_conversion_bytes")}}},
      // The device's own counts (PJRT: programs compiled, loaded from the disk cache, reused, run).
      {"device_counters", runtime(device).device_counters()},
      {"compiles", compiles},
      {"memory",
       {{"device_peak_bytes", mem.peak_bytes},
        // In use plus the allocator's pooled blocks, at most: what the device's memory held.
        {"device_reserved_peak_bytes", mem.reserved_peak_bytes},
        {"device_pool_evictions", mem.pool_evictions},
        {"host_peak_rss_bytes", int64_t(usage.ru_maxrss) * 1024}}},
      {"io", {{"bytes_read", io::bytes_read()}}}};
  // An object given for a key the report already has (memory) adds to it.
  for (auto& [k, v] : extra.items()) {
    if (v.is_object() && report.contains(k) && report[k].is_object()) report[k].update(v);
    else report[k] = v;
  }
  // Through a temporary next to the final target, renamed onto it (io/output_file.h).
  const std::string text = report.dump(2) + '\n';
  io::write_output_atomically("report", file, [&](FILE* f) {
    if (std::fwrite(text.data(), 1, text.size(), f) != text.size())
      fail("report", "cannot write ", file.string(), ": ", std::strerror(errno));
  });
}

nlohmann::json profile_report() {
  const Profile p = profile();
  nlohmann::json by_op = nlohmann::json::object(), by_component = nlohmann::json::object();
  for (const auto& [key, row] : p.by_op) {
    by_op[key.first][key.second] = {{"seconds", row.seconds}, {"launches", row.launches}, {"bytes", row.bytes}};
    by_component[key.first] = by_component.value(key.first, 0.0) + row.seconds;
  }
  return {{"idle_row", kIdleOp}, {"by_component", by_component}, {"by_op", by_op}};
}

nlohmann::json compile_report() {
  const CompileStats s = compile_stats();
  nlohmann::json events = nlohmann::json::array();
  for (const CompileEvent& e : s.events) {
    events.push_back({{"kind", "executable"},
                      {"callable", e.callable},
                      {"reason", e.reason},
                      {"source", e.source},
                      {"fingerprint", hex64(e.fingerprint)},
                      {"trace_seconds", e.trace_seconds},
                      {"seconds", e.seconds},
                      {"nodes", e.nodes},
                      {"launches", e.launches},
                      {"arena_bytes", e.arena_bytes}});
  }
  // Linear weights packed for the GEMM (CompileOptions::prepack_weights): how many, their
  // device bytes (made, and still held), launches that reused one, and launches that read plain
  // weights instead.
  const auto p = runtime(Device::cpu()).device_counters();
  const nlohmann::json prepacked_weights = {{"packed", p.at("prepacked_weights")},
                                            {"bytes", p.at("prepacked_bytes")},
                                            {"live_bytes", p.at("prepacked_live_bytes")},
                                            {"reused", p.at("prepacked_reused")},
                                            {"skipped", p.at("prepacked_skipped")}};
  return {{"calls", s.calls},
          {"traces", s.traces},
          {"compiles", s.compiles},
          {"shared_hits", s.shared_hits},
          {"disk_hits", s.disk_hits},
          {"disk_writes", s.disk_writes},
          {"disk_rejects", s.disk_rejects},
          {"graph_breaks", s.graph_breaks},
          {"eager_fallbacks", s.eager_fallbacks},
          {"trace_seconds", s.trace_seconds},
          {"compile_seconds", s.compile_seconds},
          {"load_seconds", s.load_seconds},
          {"cache_dir", executable_cache_dir().string()},
          {"prepacked_weights", prepacked_weights},
          {"executables", events}};
}

}  // namespace kiln::cli
