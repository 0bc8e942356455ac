// Console output as usual, plus each benchmark's fastest repetition in milliseconds (for
// benchmarks registered with Unit(kMillisecond)), keyed by the registered name, for the
// summaries the benchmarks print after their runs.
#pragma once
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

namespace kiln::bench {

class BestTimeReporter : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, double> best_ms;

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
      const double ms = r.GetAdjustedRealTime();
      auto [it, fresh] = best_ms.emplace(r.run_name.function_name, ms);
      if (!fresh) it->second = std::min(it->second, ms);
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

}  // namespace kiln::bench
