#include "report.h"

#include <sys/resource.h>

#include <fstream>

#include "core/error.h"
#include "devices/runtime.h"
#include "exec/counters.h"
#include "io/safetensors.h"

namespace kiln::cli {

void write_report(const std::filesystem::path& file, nlohmann::json inputs, nlohmann::json timings,
                  nlohmann::json extra) {
  const Counters c = counters();
  const MemoryStats mem = runtime(Device::cpu()).memory();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  nlohmann::json report{
      {"engine", {{"version", KILN_VERSION}, {"device", "cpu:0"}, {"mode", "eager"}}},
      {"inputs", std::move(inputs)},
      {"timings", std::move(timings)},
      // This build has one execution mode: nothing is compiled and there is no graph cache yet.
      {"counters",
       {{"ops_dispatched", c.ops_dispatched},
        {"kernels_launched", c.kernels_launched},
        {"graphs_compiled", 0},
        {"cache_hits", 0},
        {"cache_misses", 0},
        {"sync_points", c.sync_points},
        {"host_waits", c.host_waits}}},
      {"compiles", nlohmann::json::array()},
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
