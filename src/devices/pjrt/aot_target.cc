// AotTarget on a PJRT plugin's topology description (aot_compiler.h): graphs lowered with typed
// arguments (programs.h) and compiled with PJRT_Compile.
#include "devices/aot_target.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "devices/pjrt/aot_compiler.h"
#include "devices/pjrt/disk_cache.h"
#include "devices/pjrt/pjrt_runtime.h"
#include "devices/pjrt/programs.h"

namespace kiln::pjrt {

namespace {

class PjrtAotTarget final : public AotTarget {
 public:
  PjrtAotTarget(const std::string& plugin, const std::string& topology) : compiler_(plugin, topology) {}

  std::string describe() const override {
    char memory[32];
    std::snprintf(memory, sizeof memory, "%.1f GiB", double(compiler_.device_memory_limit()) / double(1ull << 30));
    return compiler_.platform_name() + " " + compiler_.topology() + ": " + std::to_string(compiler_.device_count()) +
           " x " + compiler_.device_kind() + ", " + memory + " each";
  }
  int devices() const override { return compiler_.device_count(); }
  int64_t memory_per_device() const override { return compiler_.device_memory_limit(); }

  // A program compiled before for this topology and plugin build has its figures on disk: the
  // same call planned again (another --tp, another placement) compiles only what changed.
  AotMemory compile(const std::string& name, const Graph& g, int replicas) const override {
    const std::string text = program_text(g, replicas);
    const std::filesystem::path file =
        cache_file("aot", text, compiler_.topology() + " " + compiler_.platform_version(), ".json");
    if (const std::optional<std::string> cached = read_cache_file(file)) {
      try {
        const nlohmann::json j = nlohmann::json::parse(*cached);
        return AotMemory{j.at("code"),        j.at("arguments"),       j.at("outputs"),
                         j.at("aliased"),     j.at("temporaries"),     j.at("compile_seconds"),
                         true,                j.value("does_not_fit", "")};
      } catch (const std::exception&) {
        // damaged: compiled again and rewritten
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    AotMemory out;
    try {
      const CompiledMemory m = compiler_.compile(name, text, replicas);
      out = AotMemory{m.code, m.arguments, m.outputs, m.aliased, m.temporaries, 0, false, ""};
    } catch (const Error& e) {
      // XLA refuses a program larger than a device at compile time: an answer, not a failure.
      const std::string what = e.what();
      if (what.find("CompileTimeHbmOom") == std::string::npos && what.find("Ran out of memory") == std::string::npos)
        throw;
      const size_t at = what.find("Ran out of memory");
      out.does_not_fit = at == std::string::npos ? what : what.substr(at);
      if (const size_t end = out.does_not_fit.find(". HLO module"); end != std::string::npos)
        out.does_not_fit.resize(end);
    }
    out.compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    store_cache_file(file, nlohmann::json{{"code", out.code},
                                          {"arguments", out.arguments},
                                          {"outputs", out.outputs},
                                          {"aliased", out.aliased},
                                          {"temporaries", out.temporaries},
                                          {"compile_seconds", out.compile_seconds},
                                          {"does_not_fit", out.does_not_fit}}
                               .dump());
    return out;
  }
  std::string program_text(const Graph& g, int replicas) const override { return typed_graph_program(g, replicas); }

 private:
  AotCompiler compiler_;
};

}  // namespace

std::unique_ptr<AotTarget> open_aot_target(DeviceType type, const std::string& topology) {
  KILN_CHECK(type == DeviceType::tpu, "device", "compiling ahead of time is for --device tpu (a topology of TPU chips), not ",
             Device{type, 0}.str());
  return std::make_unique<PjrtAotTarget>(tpu_plugin_path(), topology);
}

}  // namespace kiln::pjrt
