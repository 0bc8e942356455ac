#include "models/transformer_families.h"

#include <map>
#include <utility>

#include "core/error.h"
#include "models/flux/flux_original_keys.h"
#include "models/flux/flux_transformer.h"
#include "models/flux2/flux2_original_keys.h"
#include "models/flux2/flux2_transformer.h"
#include "models/sd3/sd3_original_keys.h"
#include "models/sd3/sd3_transformer.h"
#include "models/vae/ldm_vae_keys.h"

namespace kiln {

namespace {

template <typename Model>
nn::NamedParameters load_named(const std::filesystem::path& dir, std::optional<DType> dtype) {
  return Model::from_pretrained(dir, dtype).named_parameters();
}

}  // namespace

const std::vector<TransformerFamily>& transformer_families() {
  static const std::vector<TransformerFamily> families = {
      // FLUX.1 has a modulation per block; FLUX.2 shares its modulations across blocks.
      {"FluxTransformer2DModel", "FLUX.1", "black-forest-labs/FLUX.1-schnell", io::Layout::flux1_bfl, flux1_original_key_rules,
       {"double_blocks.0.img_mod.lin.weight", "single_blocks.0.modulation.lin.weight"},
       load_named<FluxTransformer2DModel>},
      {"SD3Transformer2DModel", "Stable Diffusion 3", "stabilityai/stable-diffusion-3.5-medium",
       io::Layout::sd3_stability, sd3_original_key_rules,
       {"joint_blocks.0.x_block.attn.qkv.weight", "joint_blocks.0.context_block.adaLN_modulation.1.weight"},
       load_named<SD3Transformer2DModel>},
      {"Flux2Transformer2DModel", "FLUX.2", "black-forest-labs/FLUX.2-dev", io::Layout::flux2_bfl, flux2_original_key_rules,
       {"single_stream_modulation.lin.weight", "double_stream_modulation_img.lin.weight"},
       load_named<Flux2Transformer2DModel>},
  };
  return families;
}

const TransformerFamily* transformer_family(const std::string& class_name) {
  for (const TransformerFamily& f : transformer_families())
    if (class_name == f.class_name) return &f;
  return nullptr;
}

const TransformerFamily* transformer_family(io::Layout layout) {
  for (const TransformerFamily& f : transformer_families())
    if (layout == f.original) return &f;
  return nullptr;
}

std::string transformer_class_names() {
  std::string out;
  for (const TransformerFamily& f : transformer_families()) {
    if (!out.empty()) out += ", ";
    out += f.class_name;
  }
  return out;
}

const io::KeyMap& original_key_map(io::Layout layout) {
  static const std::map<io::Layout, io::KeyMap> maps = [] {
    std::map<io::Layout, io::KeyMap> m;
    const auto add = [&](io::Layout l, std::vector<io::KeyRule> rules) {
      m.emplace(l, io::KeyMap{io::layout_name(l), std::move(rules)});
    };
    add(io::Layout::ldm_vae, ldm_vae_key_rules());
    for (const TransformerFamily& f : transformer_families()) add(f.original, f.original_key_rules());
    return m;
  }();
  const auto it = maps.find(layout);
  if (it == maps.end())
    fail("key map", "the ", io::layout_name(layout), " layout has no key map (its names are read as they are)");
  return it->second;
}

namespace {

const std::vector<io::LayoutSignature>& original_layout_signatures() {
  static const std::vector<io::LayoutSignature> signatures = [] {
    std::vector<io::LayoutSignature> s;
    // A transformer alone, or inside a ComfyUI or full checkpoint.
    for (const TransformerFamily& f : transformer_families())
      s.push_back({f.original, {"", "model.diffusion_model."}, f.signature});
    // A VAE alone, inside a full checkpoint, or under "vae." (some merged files).
    s.push_back({io::Layout::ldm_vae,
                 {"", "first_stage_model.", "vae."},
                 {"decoder.mid.block_1.norm1.weight", "encoder.mid.block_1.norm1.weight",
                  "decoder.up.0.block.0.norm1.weight"}});
    return s;
  }();
  return signatures;
}

}  // namespace

io::DetectedLayout detect_original_layout(const std::vector<std::string>& names, const std::string& component,
                                          const std::string& file) {
  return io::detect_layout(names, original_layout_signatures(), component, file);
}

io::DetectedLayout detect_original_layout(const nn::WeightSource& source, const std::string& component) {
  return detect_original_layout(source.names(), component, source.describe());
}

std::vector<io::DetectedLayout> detect_original_layouts(const std::vector<std::string>& names) {
  return io::detect_layouts(names, original_layout_signatures());
}

}  // namespace kiln
