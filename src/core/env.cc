#include "core/env.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/error.h"

extern char** environ;

namespace kiln::env {

namespace {

enum class Kind { flag, positive_int, positive_number, choice, text };

struct Variable {
  const char* name;
  Kind kind;
  std::vector<const char*> choices;  // Kind::choice
  const char* value_hint;            // for help: "1", "N", "DIR", ...
  const char* meaning;
};

// Leaked on purpose: runtimes may first read their variables from exit handlers, after static
// objects are destroyed.
const std::vector<Variable>& variables() {
  static const auto* v = new std::vector<Variable>{
      {"KILN_DEFER_AND_FUSE", Kind::flag, {}, "1", "deferred-and-fused mode by default (--mode overrides it)"},
      {"KILN_LAUNCH_BLOCKING", Kind::flag, {}, "1", "debug eager: wait for every kernel, so errors name the op"},
      {"KILN_CACHE_DIR", Kind::text, {}, "DIR",
       "persistent compile cache (default $XDG_CACHE_HOME/kiln or ~/.cache/kiln; 'none' turns it off)"},
      {"KILN_SPILL_DIR", Kind::text, {}, "DIR",
       "model offload: folder for the nameless file that holds weights quantized or converted at load while "
       "they wait for their turn (default: the cache folder, else the system's temporary folder; 'none' keeps "
       "them in memory)"},
      {"KILN_COLLECTIVE_TIMEOUT", Kind::positive_number, {}, "S",
       "--tp: seconds a collective waits for the other ranks before the job is aborted (default 300)"},
      {"KILN_DEFER_MAX_NODES", Kind::positive_int, {}, "N", "deferred mode: flush a pending graph at N nodes (20000)"},
      {"KILN_DEFER_MAX_LIVE_BYTES", Kind::positive_int, {}, "BYTES",
       "deferred mode: flush when held pending values exceed BYTES (8 GiB)"},
      {"KILN_GRAPH_CACHE_SIZE", Kind::positive_int, {}, "N", "deferred mode: compiled graphs kept in the cache"},
      {"KILN_DEFER_LOG", Kind::choice, {"0", "1", "2"}, "1|2",
       "deferred mode: one line per flush (1), and each launch of new graphs (2)"},
      {"KILN_MAX_PENDING", Kind::positive_int, {}, "N", "kernels the CPU queue holds before the host waits (32)"},
      {"KILN_MAX_PENDING_BYTES", Kind::positive_int, {}, "BYTES",
       "output bytes of the kernels the CPU queue holds before the host waits (256 MiB)"},
      {"KILN_GEMM", Kind::choice, {"onednn", "openblas"}, "onednn|openblas", "matrix-multiply library (onednn)"},
      {"KILN_BF16_LINEAR", Kind::choice, {"amx", "dot", "widened"}, "amx|dot|widened",
       "bf16 linears: kiln's AMX kernel, oneDNN's bf16 matmul, or bf16 widened to f32 (default: from the CPU)"},
      {"KILN_CPU_KERNELS", Kind::text, {}, "LEVEL",
       "the CPU kernels to run: native, avx512-bf16, x86-64-v4, x86-64-v3 or x86-64-v2, those this kiln was built "
       "with (default: the most capable one this CPU runs)"},
      {"KILN_BENCH_KERNEL_TIMES", Kind::flag, {}, "1", "benchmarks: time every kernel"},
      {"KILN_HOST_MEMORY_CHECK", Kind::choice, {"0", "1"}, "0",
       "0 skips the fail-fast check against the host's available memory (without --device-memory)"},
      {"KILN_PJRT_PLUGIN", Kind::text, {}, "PATH",
       "--device pjrt: the PJRT plugin to load (default: XLA's CPU plugin from scripts/install-deps.sh)"},
      {"KILN_PJRT_CPU_DEVICES", Kind::positive_int, {}, "N",
       "--device pjrt with XLA's CPU plugin: how many devices it makes (4), one per --tp rank"},
      {"KILN_TPU_PLUGIN", Kind::text, {}, "PATH",
       "--device tpu and kiln plan --device tpu: the TPU PJRT plugin (default: libtpu from scripts/install-deps.sh)"},
  };
  return *v;
}

const Variable& declared(const char* name) {
  for (const Variable& v : variables())
    if (std::strcmp(v.name, name) == 0) return v;
  fail("env", "internal: ", name, " is not a declared KILN_* variable");
}

std::optional<std::string> raw(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return std::nullopt;
  return std::string(v);
}

std::string choices_text(const Variable& v) {
  std::string s;
  for (const char* c : v.choices) s += std::string(s.empty() ? "'" : ", '") + c + "'";
  return s;
}

// Checks one variable's value against its kind (the readers and check_all share this).
void check(const Variable& v, const std::string& value) {
  switch (v.kind) {
    case Kind::flag:
      KILN_CHECK(value == "0" || value == "1", "env", v.name, "='", value, "': expected 1 (on) or 0 (off)");
      return;
    case Kind::positive_int: {
      char* end = nullptr;
      errno = 0;
      const unsigned long long x = std::strtoull(value.c_str(), &end, 10);
      const bool digits = value.find_first_not_of("0123456789") == std::string::npos;
      KILN_CHECK(digits && end != value.c_str() && *end == 0 && errno == 0 && x > 0, "env", v.name, "='",
                 value, "': expected a positive whole number");
      return;
    }
    case Kind::positive_number: {
      char* end = nullptr;
      const double x = std::strtod(value.c_str(), &end);
      KILN_CHECK(end != value.c_str() && *end == 0 && std::isfinite(x) && x > 0, "env", v.name, "='", value,
                 "': expected a positive number");
      return;
    }
    case Kind::choice:
      for (const char* c : v.choices)
        if (value == c) return;
      fail("env", v.name, "='", value, "': expected one of ", choices_text(v));
    case Kind::text: return;
  }
}

std::optional<std::string> checked(const char* name, Kind kind) {
  const Variable& v = declared(name);
  KILN_CHECK(v.kind == kind, "env", "internal: ", name, " is read as another kind than declared");
  const auto value = raw(name);
  if (value) check(v, *value);
  return value;
}

}  // namespace

bool flag(const char* name) { return checked(name, Kind::flag).value_or("0") == "1"; }

std::optional<uint64_t> positive_int(const char* name) {
  const auto v = checked(name, Kind::positive_int);
  if (!v) return std::nullopt;
  return uint64_t(std::strtoull(v->c_str(), nullptr, 10));
}

std::optional<double> positive_number(const char* name) {
  const auto v = checked(name, Kind::positive_number);
  if (!v) return std::nullopt;
  return std::strtod(v->c_str(), nullptr);
}

std::optional<std::string> choice(const char* name) { return checked(name, Kind::choice); }
std::optional<std::string> text(const char* name) { return checked(name, Kind::text); }

std::vector<std::string> check_all() {
  std::vector<std::string> unknown;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view entry(*e);
    if (!entry.starts_with("KILN_")) continue;
    const size_t eq = entry.find('=');
    const std::string name(entry.substr(0, eq));
    const std::string value(eq == std::string_view::npos ? "" : entry.substr(eq + 1));
    const Variable* v = nullptr;
    for (const Variable& d : variables())
      if (name == d.name) v = &d;
    if (!v) {
      unknown.push_back(name);
      continue;
    }
    if (!value.empty()) check(*v, value);
  }
  return unknown;
}

std::string help() {
  std::string s;
  for (const Variable& v : variables()) {
    std::string left = std::string("  ") + v.name + "=" + v.value_hint;
    if (left.size() < 34) left.append(34 - left.size(), ' ');
    else left += "\n" + std::string(34, ' ');
    s += left + v.meaning + "\n";
  }
  return s;
}

}  // namespace kiln::env
