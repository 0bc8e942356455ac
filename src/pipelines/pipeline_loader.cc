#include "pipelines/pipeline_loader.h"

#include "core/error.h"
#include "io/input_file.h"
#include "io/model_folder.h"
#include "io/relative_name.h"
#include "pipelines/component_file.h"
#include "pipelines/model_argument.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

// --quantize TYPE with a checkpoint file (--transformer FILE) that stores weights quantized in
// another type: refused, naming both, rather than keeping the file's type under a report and a
// message that say TYPE. kiln does not requantize, as llama.cpp's quantize refuses to without
// --allow-requantize: Q8_0's rounding and then Q4_0's on top lose more than quantizing the float
// weights once. The file's own type is allowed (nothing to do, its float tensors quantized to it).
void check_not_requantized(const std::string& component, const fs::path& file, DType want) {
  const std::shared_ptr<const nn::WeightSource> source = nn::open_checkpoint(file);
  for (const std::string& key : source->names())
    if (const std::optional<DType> t = source->stored_dtype(key); t && is_storage_only(*t) && *t != want)
      fail("pipeline", "--quantize ", dtype_name(want), " for ", component, ": its checkpoint file ", file.string(),
           " already stores weights quantized as ", dtype_name(*t), " (tensor '", key,
           "'), and kiln does not requantize them; leave --quantize out to run the file's ", dtype_name(*t),
           ", or quantize the float checkpoint instead (kiln convert --quantize ", dtype_name(want), ")");
}

// The class an index entry names ([library, class]); "" for [null, null].
std::string entry_class(const nlohmann::json& entry) {
  if (entry.is_array() && entry.size() == 2 && entry[1].is_null()) return "";
  return entry.is_array() && entry.size() == 2 && entry[1].is_string() ? entry[1].get<std::string>() : entry.dump();
}

}  // namespace

PipelineLoader::PipelineLoader(const fs::path& model, const PipelineOptions& options,
                               const std::string& pipeline_class, std::vector<ComponentClasses> classes,
                               std::vector<std::string> model_components)
    : t0_(std::chrono::steady_clock::now()),
      state_([&] {
        auto state = std::make_unique<PipelineState>();
        state->dir = pipeline_folder(model);  // resolved once: a repo id's lookup reads refs/main
        return state;
      }()),
      index_(state_->dir / "model_index.json") {
  state_->options = options;
  state_->device = options.device;
  const fs::path index_file = state_->dir / "model_index.json";
  io::model_index_components(index_, state_->dir, "pipeline");  // every listed name, before any load
  const std::string cls = index_.get_string("_class_name", "");
  KILN_CHECK(cls.empty() || cls == pipeline_class, "pipeline", index_file.string(), ": _class_name is '", cls,
             "', expected ", pipeline_class);
  for (const ComponentClasses& c : classes) {
    if (!index_.has(c.component)) {
      KILN_CHECK(c.optional, "pipeline", index_file.string(), ": component '", c.component, "' is not listed");
      continue;
    }
    const std::string got = entry_class(index_.json()[c.component]);
    if (got.empty()) {
      KILN_CHECK(c.optional, "pipeline", index_file.string(), ": component '", c.component, "' is [null, null], but ",
                 pipeline_class, " needs it");
      continue;
    }
    KILN_CHECK(!c.classes.empty(), "pipeline", index_file.string(), ": component '", c.component, "' is ", got,
               ", which kiln's ", pipeline_class, " does not load (text-to-image only); expected [null, null]");
    std::string expected;
    bool known = false;
    for (const std::string& k : c.classes) {
      known = known || got == k;
      expected += (expected.empty() ? "" : " or ") + k;
    }
    KILN_CHECK(known, "pipeline", index_file.string(), ": component '", c.component, "' is ", got, ", which kiln's ",
               pipeline_class, " does not implement (expected ", expected, ")");
  }
  const auto check_component = [&](const std::string& name, const char* what) {
    bool known = false;
    std::string list;
    for (const std::string& m : model_components) {
      known = known || name == m;
      list += (list.empty() ? "" : ", ") + m;
    }
    KILN_CHECK(known, "pipeline", what, " given for unknown component '", name, "' (", pipeline_class, "'s are ", list,
               ")");
  };
  for (const auto& [name, dtype] : options.component_dtype) check_component(name, "dtype");
  for (const auto& [name, type] : options.quantize) {
    check_component(name, "quantization");
    KILN_CHECK(is_storage_only(type), "pipeline", "quantization for ", name,
               " must be q8_0, q4_0, q4_k, q5_k, f8_e4m3 or f8_e5m2, got ", dtype_name(type));
  }
  for (const auto& [name, file] : options.component_files) {
    check_component(name, "a checkpoint file");
    // Says what the path is instead (a folder, a FIFO, ...); never opened here (io/input_file.h).
    io::check_input_file("pipeline", "checkpoint file for " + name + " (" + file.string() + ")", file,
                         "a safetensors or GGUF file");
  }
  for (const auto& [name, type] : options.quantize)
    if (const auto file = options.component_files.find(name); file != options.component_files.end())
      check_not_requantized(name, file->second, type);
  // Diffusers refuses tensor parallelism with quantization: so does kiln, before
  // anything is loaded, rather than loading a whole model on every rank.
  KILN_CHECK(!options.tensor_parallel || (options.quantize.empty() && options.component_files.empty()), "pipeline",
             "tensor parallelism (--tp) with --quantize or a single-file checkpoint is not supported");
  for (const ComponentClasses& c : classes)  // every folder, before any load
    if (has(c.component)) path(c.component);
  for (const std::string& m : model_components) state_->components.push_back({m, ComponentWeights(m), DType::f32, {}});
}

bool PipelineLoader::has(const std::string& component) const {
  return index_.has(component) && !entry_class(index_.json()[component]).empty();
}

fs::path PipelineLoader::path(const std::string& component) const {
  const fs::path index_file = state_->dir / "model_index.json";
  KILN_CHECK(index_.has(component), "pipeline", index_file.string(), ": component '", component, "' is not listed");
  io::check_relative_name("pipeline", index_file, "component", component,
                          "a component folder inside " + state_->dir.string());
  const fs::path p = state_->dir / component;
  KILN_CHECK(fs::is_directory(p), "pipeline", "component folder ", p.string(), " is missing (listed in ",
             index_file.string(), ")");
  return p;
}

std::optional<DType> PipelineLoader::quantization(const std::string& component) const {
  const auto& q = state_->options.quantize;
  const auto it = q.find(component);
  return it == q.end() ? std::nullopt : std::optional<DType>(it->second);
}

std::shared_ptr<const nn::WeightSource> PipelineLoader::replacement(const std::string& component) const {
  const auto& files = state_->options.component_files;
  const auto it = files.find(component);
  return it == files.end() ? nullptr : open_component_file(it->second, component);
}

std::optional<DType> PipelineLoader::dtype(const std::string& component) const {
  std::optional<DType> want = state_->options.dtype;
  const auto& per = state_->options.component_dtype;
  if (const auto it = per.find(component); it != per.end()) want = it->second;
  KILN_CHECK(!want || is_floating(*want), "pipeline", "dtype for ", component, " must be bf16, f16 or f32, got ",
             dtype_name(*want));
  return want;
}

PipelineComponent& PipelineLoader::slot(const std::string& component) {
  for (PipelineComponent& c : state_->components)
    if (c.name == component) {
      loaded_.push_back(component);
      return c;
    }
  fail("pipeline", "internal: '", component, "' is not a model component of this pipeline");
}

void PipelineLoader::progress(const std::string& component, double seconds) const {
  if (!options().on_progress) return;
  std::string detail;
  if (const auto file = options().component_files.find(component); file != options().component_files.end())
    detail = "from " + file->second.filename().string();
  if (const std::optional<DType> q = quantization(component))
    detail += std::string(detail.empty() ? "" : ", ") + "quantizing to " + dtype_name(*q);
  options().on_progress({"load", component, detail, seconds});
}

void PipelineLoader::report_unused(const PipelineComponent& c, const std::vector<std::string>& unused) const {
  for (const std::string& u : unused) {
    const std::string msg = c.name + " does not use these checkpoint tensors: " + u;
    KILN_CHECK(!state_->options.strict, "weights", msg, " (--strict refuses them)");
    if (state_->options.on_warning) state_->options.on_warning(msg);
  }
}

std::unique_ptr<PipelineState> PipelineLoader::finish() {
  std::vector<PipelineComponent> kept;
  for (PipelineComponent& c : state_->components)
    for (const std::string& l : loaded_)
      if (l == c.name) {
        kept.push_back(std::move(c));
        break;
      }
  state_->components = std::move(kept);
  state_->load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  return std::move(state_);
}

}  // namespace kiln
