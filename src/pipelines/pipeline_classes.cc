// DiffusionPipeline::from_pretrained: the pipeline classes kiln implements, by the
// _class_name model_index.json gives them (Diffusers' DiffusionPipeline.from_pretrained).
#include "core/error.h"
#include "io/json_config.h"
#include "pipelines/flux2_pipeline.h"
#include "pipelines/flux_pipeline.h"
#include "pipelines/model_argument.h"
#include "pipelines/stable_diffusion_3_pipeline.h"

namespace kiln {

namespace {

struct PipelineClass {
  const char* name;
  std::unique_ptr<DiffusionPipeline> (*load)(const std::filesystem::path&, const PipelineOptions&);
};

template <typename P>
std::unique_ptr<DiffusionPipeline> load_as(const std::filesystem::path& dir, const PipelineOptions& options) {
  return std::make_unique<P>(P::from_pretrained(dir, options));
}

const std::vector<PipelineClass>& pipeline_classes() {
  static const std::vector<PipelineClass> table = {
      {FluxPipeline::kClassName, &load_as<FluxPipeline>},
      {StableDiffusion3Pipeline::kClassName, &load_as<StableDiffusion3Pipeline>},
      {Flux2Pipeline::kClassName, &load_as<Flux2Pipeline>},
      {Flux2KleinPipeline::kClassName, &load_as<Flux2KleinPipeline>},
  };
  return table;
}

}  // namespace

const std::vector<std::string>& DiffusionPipeline::supported_classes() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const PipelineClass& c : pipeline_classes()) n.push_back(c.name);
    return n;
  }();
  return names;
}

std::unique_ptr<DiffusionPipeline> DiffusionPipeline::from_pretrained(const std::filesystem::path& model,
                                                                      const PipelineOptions& options) {
  const std::filesystem::path folder = pipeline_folder(model);  // the class's loader starts from it
  const std::filesystem::path index_file = folder / "model_index.json";
  const io::JsonConfig index(index_file);
  // Folders written before _class_name was required are FLUX.1's (the only class kiln had).
  const std::string cls = index.get_string("_class_name", FluxPipeline::kClassName);
  std::string list;
  for (const PipelineClass& c : pipeline_classes()) {
    if (cls == c.name) return c.load(folder, options);
    list += (list.empty() ? "" : ", ") + std::string(c.name);
  }
  fail("pipeline", index_file.string(), ": _class_name is '", cls, "', a pipeline kiln does not implement (supported: ",
       list, ")");
}

}  // namespace kiln
