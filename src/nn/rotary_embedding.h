// Rotary position embeddings over several id axes (Diffusers' FluxPosEmbed, which FLUX.1 and
// FLUX.2 share): the tables, their application to Q/K, the ids' checks and a per-ids cache.
// (The time/guidance/pooled-text embeddings are nn/embeddings.h.)
#pragma once
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "nn/layers.h"

namespace kiln::nn {

// cos and sin tables [S, head_dim] (f32) for the joint sequence, text rows first.
struct RotaryTables {
  Tensor cos, sin;   // [S, head_dim]
  Tensor pair_sign;  // [head_dim/2, 2] of (-1, 1): rotates a reversed (x[2i+1], x[2i]) pair into (-x[2i+1], x[2i])
  static RotaryTables of(Tensor cos, Tensor sin);
  // As a compiled function's arguments: `before`, then cos, sin, pair_sign; their names; and the
  // tables back from args[first..first+2].
  std::vector<Tensor> args(std::vector<Tensor> before) const;
  static std::vector<std::string> arg_names(std::vector<std::string> before);
  static RotaryTables from_args(const std::vector<Tensor>& args, size_t first);
};

// FluxPosEmbed(theta, axes_dim) on ids [S, n_axes]: per axis a, frequencies 1/theta^(2j/d_a)
// and phases pos*freq in float64, cos/sin rounded to f32, each frequency repeated for the
// adjacent pair (2j, 2j+1), axes concatenated along features.
RotaryTables flux_pos_embed(const Tensor& ids, const std::vector<int64_t>& axes_dim, double theta = 10000);

// A config's axes_dims_rope: every axis even and positive, summing to attention_head_dim; errors
// name `model` and `source` (the config file).
void check_axes_dims_rope(const std::vector<int64_t>& axes_dims, int64_t head_dim, const char* model,
                          const std::string& source);

// Rotates adjacent pairs of x [B, S, H, hd] (Q or K): out[2i] = x[2i] c - x[2i+1] s,
// out[2i+1] = x[2i+1] c + x[2i] s, computed in f32 and cast back to x's dtype.
Tensor apply_rotary_emb(const Tensor& x, const RotaryTables& rope);

// Attention over a joint sequence: q, k (already normalised) and v as [B, S, H, hd]; RoPE on q
// and k, SDPA with scale 1/sqrt(hd), no mask -> [B, S, H*hd].
Tensor rope_attention(const Tensor& q, const Tensor& k, const Tensor& v, const RotaryTables& rope);

// Ids may come as [S, n_axes] or (deprecated) [1, S, n_axes]; Diffusers then uses batch element 0.
// `model` and `name` name them in the error.
Tensor ids_2d(const Tensor& ids, const char* model, const char* name);

// The RoPE tables are built on the host from the ids (a sync), and a pipeline passes the same id
// tensors at every step: tensors are immutable values, so the tables of the last (img_ids,
// txt_ids) pair are kept and reused while the same tensors come back. Thread-safe.
class RotaryCache {
 public:
  RotaryTables get(const Tensor& img_ids, const Tensor& txt_ids, const std::function<RotaryTables()>& make) const;

 private:
  struct Entry {
    Tensor img_ids, txt_ids;
    RotaryTables tables;
  };
  struct Slot {
    std::mutex mu;
    std::shared_ptr<const Entry> entry;
  };
  std::shared_ptr<Slot> slot_ = std::make_shared<Slot>();
};

// The rotary tables of a FLUX-style model's joint sequence (text rows first, FluxPosEmbed), from
// the img_ids / txt_ids its pipeline passes at every step: what FLUX.1 and FLUX.2 share.
class JointRotaryEmbedding {
 public:
  JointRotaryEmbedding() = default;
  // `model` names the model in errors.
  JointRotaryEmbedding(std::vector<int64_t> axes_dim, double theta, const char* model);
  // FluxPosEmbed over concat(txt_ids, img_ids) -> cos/sin [L_txt + L_img, head_dim], uncached.
  RotaryTables operator()(const Tensor& img_ids, const Tensor& txt_ids) const;
  // The same after checking the ids are [l_img, axes] / [l_txt, axes], cached per ids pair.
  RotaryTables for_step(const Tensor& img_ids, const Tensor& txt_ids, int64_t l_img, int64_t l_txt) const;
  // Tables of `rows` rows whose contents are never read (warm-up, activation estimates).
  static RotaryTables placeholder(int64_t rows, int64_t head_dim);

 private:
  std::vector<int64_t> axes_dim_;
  double theta_ = 10000;
  const char* model_ = "";
  RotaryCache cache_;
};

}  // namespace kiln::nn
