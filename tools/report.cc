#include "report.h"

#include <sys/resource.h>

#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "devices/runtime.h"
#include "exec/counters.h"
#include "exec/deferred.h"
#include "exec/mode.h"
#include "io/safetensors.h"

namespace kiln::cli {

void write_report(const std::filesystem::path& file, nlohmann::json inputs, nlohmann::json timings,
                  nlohmann::json extra) {
  const Counters c = counters();
  const DeferredStats d = deferred_stats();
  nlohmann::json flushes = nlohmann::json::object();
  for (int i = 0; i < kNumFlushCauses; ++i) flushes[flush_cause_name(FlushCause(i))] = d.flushes[i];
  // One entry per graph compiled in this process (deferred mode: one per distinct fingerprint).
  nlohmann::json compiles = nlohmann::json::array();
  for (const GraphCacheEntryStats& e : d.entries) {
    char key[17];
    std::snprintf(key, sizeof key, "%016llx", static_cast<unsigned long long>(e.fingerprint));
    compiles.push_back({{"kind", "deferred_graph"},
                        {"fingerprint", key},
                        {"reason", "new graph fingerprint"},
                        {"seconds", e.compile_seconds},
                        {"nodes", e.nodes},
                        {"launches", e.launches},
                        {"runs", e.runs}});
  }
  const MemoryStats mem = runtime(Device::cpu()).memory();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  nlohmann::json report{
      {"engine", {{"version", KILN_VERSION}, {"device", "cpu:0"}, {"mode", eager_mode_name(eager_mode())}}},
      {"inputs", std::move(inputs)},
      {"timings", std::move(timings)},
      {"counters",
       {{"ops_dispatched", c.ops_dispatched},
        {"kernels_launched", c.kernels_launched},
        {"kernels_by_name", kernels_by_name()},
        {"graphs_compiled", d.cache_misses},
        {"cache_hits", d.cache_hits},
        {"cache_misses", d.cache_misses},
        {"compile_seconds", d.compile_seconds},
        {"graph_host_seconds", d.host_seconds},
        {"graphs_run", d.graphs_run},
        {"flushes", flushes},
        {"sync_points", c.sync_points},
        {"host_waits", c.host_waits}}},
      {"compiles", compiles},
      {"memory", {{"device_peak_bytes", mem.peak_bytes}, {"host_peak_rss_bytes", int64_t(usage.ru_maxrss) * 1024}}},
      {"io", {{"bytes_read", io::bytes_read()}}}};
  for (auto& [k, v] : extra.items()) report[k] = v;
  const std::filesystem::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp);
    KILN_CHECK(out.good(), "report", "cannot write ", file.string());
    out << report.dump(2) << '\n';
    KILN_CHECK(out.good(), "report", "failed writing ", file.string());
  }
  std::filesystem::rename(tmp, file);
}

}  // namespace kiln::cli
