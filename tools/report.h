// The JSON run report (--report FILE): engine, inputs, timings, counters,
// compiles, memory, io. Written atomically (temp file, then rename) under the output rule of
// io/output_file.h: a symlink is written through; a folder, device, FIFO or socket is refused.
#pragma once
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/device.h"

namespace kiln::cli {

// Compiled mode's counters and one entry per executable obtained (the report's `compiled`).
nlohmann::json compile_report();

// The profile (exec/profile.h) since its last reset: by_op[component][launch name] = seconds,
// launches, bytes; by_component[component] = the seconds of its rows.
nlohmann::json profile_report();

// `device`: the device the run computed on, whose memory the report states.
void write_report(const std::filesystem::path& file, nlohmann::json inputs, nlohmann::json timings,
                  nlohmann::json extra = nlohmann::json::object(), const Device& device = Device::cpu());

}  // namespace kiln::cli
