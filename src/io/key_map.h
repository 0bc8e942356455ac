// Original single-file checkpoint layouts (BFL's FLUX, Stability's SD3, the LDM VAE) and the
// Diffusers state-dict names kiln's models read, related by a declarative key map: a list of
// rules, each naming one original tensor by a pattern with block-index placeholders and the
// Diffusers tensor(s) it holds. One generic machinery reads every family's map both ways:
// resolve_key_map (original file -> Diffusers names, nn::KeyMappedSource) and invert_key_map
// (Diffusers tensors -> the original file, nn::write_original_layout). The families' maps are
// data in their model folders (models/flux/flux_original_keys.h, ...).
//
// Pattern syntax: "{i}" and "{j}" stand for block indices (decimal digits), e.g.
// "encoder.down.{i}.block.{j}.norm1.weight"; everything else is literal.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/shape.h"

namespace kiln::io {

// How one original tensor holds its Diffusers tensor(s).
enum class KeyTransform {
  whole,              // the same tensor under another name
  rows,               // consecutive row ranges (dim 0), one per Diffusers key, in order (a fused qkv)
  conv1x1_to_linear,  // a 1x1 conv weight [O, I, 1, 1] that Diffusers holds as a linear [O, I]
  swap_halves,        // the two row halves in the other order: original (shift, scale) AdaLN
                      // modulation, Diffusers' (scale, shift) AdaLayerNormContinuous
};

// Which blocks a rule applies to, by its {i} among the indices present (last = the highest).
enum class BlockCondition { any, last, not_last };

// (Not 0: GCC 12 at -O3 -march=native stores the list {1, 1, 1, 0} of a vector<int64_t> argument
// as {1, 1, 1, 1} in flux_original_keys.cc; checked with its assembly.)
constexpr int64_t kRestOfRows = -1;

struct KeyRule {
  std::string original = {};           // "double_blocks.{i}.img_attn.qkv.weight"
  std::vector<std::string> diffusers = {};  // "transformer_blocks.{i}.attn.to_q.weight", ...
  KeyTransform transform = KeyTransform::whole;
  // rows: each part's row count in units, kRestOfRows for "the rest" (at most one, any position).
  // The unit is the tensor's rows / sum(row_units) (equal parts: {1, 1, 1}) unless unit_from
  // names a tensor (a pattern, same indices) whose dim unit_dim gives it (FLUX.1's single-block
  // linear1: q, k, v of `hidden` rows each, then the MLP: {1, 1, 1, kRestOfRows} with unit =
  // linear1.weight's dim 1).
  std::vector<int64_t> row_units = {};
  std::string unit_from = {};
  int unit_dim = 0;
  // May be absent where its block exists (guidance_in, attn2, a resnet's nin_shortcut, ...);
  // a rule that is not optional is required in every block whose other tensors are present.
  bool optional = false;
  // {i} counts the other way on the Diffusers side: i_diffusers = n - 1 - i_original, n the
  // number of blocks present (the LDM decoder's up blocks).
  bool reversed_index = false;
  BlockCondition when = BlockCondition::any;
};

struct KeyMap {
  std::string name;  // "FLUX.1 (BFL layout)": names the map in errors
  std::vector<KeyRule> rules;
};

// One Diffusers tensor: where it lies in the original tensor `original`.
struct MappedTensor {
  std::string original = {};  // the original key (without the file's prefix)
  KeyTransform transform = KeyTransform::whole;
  int64_t row_begin = 0;  // rows: the Diffusers tensor is rows [row_begin, row_begin + shape[0])
  Shape original_shape = {};
  Shape shape = {};  // the Diffusers tensor's shape
};

using ShapeOf = std::function<Shape(const std::string& key)>;

// Diffusers key -> its place in the original tensors `originals` (keys without the prefix).
// Errors name `file` and the tensor: an original tensor no rule (or two rules) matches; a
// required original tensor missing from a block the file has (naming the Diffusers tensors it
// would give); a row split that does not fit the tensor's shape; a Diffusers key given twice.
std::map<std::string, MappedTensor> resolve_key_map(const KeyMap& map, const std::vector<std::string>& originals,
                                                    const ShapeOf& shape_of, const std::string& file);

// One original tensor to write: its Diffusers parts in row order (one for whole, squeeze and swap).
struct OriginalTensor {
  std::string key;  // without prefix
  KeyTransform transform = KeyTransform::whole;
  std::vector<std::string> parts;
  Shape shape;  // the original tensor's shape
};

// The inverse, from the same rules: the original tensors that hold the Diffusers tensors `keys`,
// sorted by key. Errors name `source`: a Diffusers tensor no rule writes; a fused original tensor
// with some of its parts missing.
std::vector<OriginalTensor> invert_key_map(const KeyMap& map, const std::vector<std::string>& keys,
                                           const ShapeOf& shape_of, const std::string& source);

// ---- layout detection ----

enum class Layout {
  diffusers,      // already Diffusers / transformers names
  flux1_bfl,      // FLUX.1 transformer, Black Forest Labs' names (double_blocks, single_blocks, img_in ...)
  flux2_bfl,      // FLUX.2 transformer, BFL's names (shared *_modulation.lin, single_blocks.linear1 ...)
  sd3_stability,  // SD3 / SD3.5 transformer, Stability's MMDiT names (joint_blocks, x_embedder ...)
  ldm_vae,        // AutoencoderKL in the LDM names (encoder.down.N.block.M, mid.attn_1, decoder.up.N ...)
};
const char* layout_name(Layout layout);
// The component a layout's tensors make up: "transformer", "vae" ("" for diffusers).
const char* layout_component(Layout layout);

struct DetectedLayout {
  Layout layout = Layout::diffusers;
  // Taken off every key of the component ("model.diffusion_model." in ComfyUI files and full
  // checkpoints, "first_stage_model." or "vae." for a VAE inside one); keys without it belong to
  // other components and are left alone.
  std::string prefix;
};

// Tensors only one layout has (under one of its prefixes); any one of them identifies it. The
// layouts' signatures are registered with the model families (models/transformer_families.h).
struct LayoutSignature {
  Layout layout;
  std::vector<std::string> prefixes;
  std::vector<std::string> keys;
};

// The layout of the tensors `names` (a file's keys) for `component` ("transformer", "vae",
// "text_encoder", ...; "" for whichever the file holds) among `signatures`. Text encoders are
// read in their transformers names (diffusers). Errors name `file` when the file holds another
// component in an original layout and none of `component`.
DetectedLayout detect_layout(const std::vector<std::string>& names, const std::vector<LayoutSignature>& signatures,
                             const std::string& component = "", const std::string& file = "");
// Every layout among `signatures` that `names` carry, in the signatures' order (an all-in-one
// file carries a transformer's and a VAE's).
std::vector<DetectedLayout> detect_layouts(const std::vector<std::string>& names,
                                           const std::vector<LayoutSignature>& signatures);

// Rule builders the families' maps share. A Linear: its weight and its bias (`original`.weight ->
// `diffusers`.weight, ...), each under one rule.
void add_linear(std::vector<KeyRule>& rules, const std::string& original, const std::string& diffusers,
                bool optional = false, KeyTransform transform = KeyTransform::whole,
                BlockCondition when = BlockCondition::any);
// A fused Linear whose output rows are several Diffusers Linears, in `units` proportions (see
// KeyRule::row_units), weight and bias alike.
void add_fused_linear(std::vector<KeyRule>& rules, const std::string& original, const std::vector<std::string>& diffusers,
                      std::vector<int64_t> units, bool optional = false, const std::string& unit_from = "",
                      int unit_dim = 0);

}  // namespace kiln::io
