// Small Mistral3 / Qwen3 text-encoder checkpoints for the CausalLMTextEncoder tests, written to a
// temporary folder with generated weights (deterministic_weights.h), and an independent
// double-precision reference of the language model's hidden states written from the spec's
// formulas (flux2.md §7.4): host loops, no kiln op.
#pragma once
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "deterministic_weights.h"
#include "io/safetensors.h"
#include "models/llm/decoder_lm_config.h"

namespace kiln::test {

struct TinyLM {
  std::string config_json;          // the text_encoder/config.json
  std::map<std::string, Shape> shapes;  // every checkpoint tensor
};

// The language model's tensors under `prefix` for `c` (Qwen3 adds q_norm/k_norm).
inline void add_language_model(std::map<std::string, Shape>& s, const std::string& prefix, const DecoderLMConfig& c) {
  const int64_t M = c.hidden_size, hd = c.head_dim, Q = c.num_attention_heads * hd, KV = c.num_key_value_heads * hd,
                F = c.intermediate_size;
  s[prefix + "embed_tokens.weight"] = {c.vocab_size, M};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string l = prefix + "layers." + std::to_string(i) + ".";
    s[l + "input_layernorm.weight"] = {M};
    s[l + "post_attention_layernorm.weight"] = {M};
    s[l + "self_attn.q_proj.weight"] = {Q, M};
    s[l + "self_attn.k_proj.weight"] = {KV, M};
    s[l + "self_attn.v_proj.weight"] = {KV, M};
    s[l + "self_attn.o_proj.weight"] = {M, Q};
    if (c.qk_norm()) {
      s[l + "self_attn.q_norm.weight"] = {hd};
      s[l + "self_attn.k_norm.weight"] = {hd};
    }
    s[l + "mlp.gate_proj.weight"] = {F, M};
    s[l + "mlp.up_proj.weight"] = {F, M};
    s[l + "mlp.down_proj.weight"] = {M, F};
  }
  s[prefix + "norm.weight"] = {M};
}

// A Mistral3ForConditionalGeneration folder layout (transformers >= 4.52 keys): language model
// under model.language_model., plus an lm_head, a vision tower and a projector it never reads.
inline TinyLM tiny_mistral3(int64_t layers = 3, int64_t hidden = 32, int64_t heads = 4, int64_t kv_heads = 2,
                            int64_t head_dim = 8, int64_t intermediate = 48, const std::string& sliding_window = "null") {
  TinyLM m;
  m.config_json = R"({"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
    "text_config": {"model_type": "mistral", "vocab_size": 64, "hidden_size": )" +
                  std::to_string(hidden) + R"(, "intermediate_size": )" + std::to_string(intermediate) +
                  R"(, "num_hidden_layers": )" + std::to_string(layers) + R"(, "num_attention_heads": )" +
                  std::to_string(heads) + R"(, "num_key_value_heads": )" + std::to_string(kv_heads) +
                  R"(, "head_dim": )" + std::to_string(head_dim) + R"(, "rms_norm_eps": 1e-05,
      "rope_theta": 1000000000.0, "sliding_window": )" + sliding_window + R"(, "hidden_act": "silu"},
    "vision_config": {"model_type": "pixtral", "hidden_size": 16}})";
  const DecoderLMConfig c = DecoderLMConfig::from_json(io::JsonConfig::from_string(m.config_json, "tiny mistral3"));
  add_language_model(m.shapes, "model.language_model.", c);
  m.shapes["lm_head.weight"] = {c.vocab_size, c.hidden_size};
  m.shapes["model.vision_tower.transformer.layers.0.attention.q_proj.weight"] = {16, 16};
  m.shapes["model.multi_modal_projector.linear_1.weight"] = {16, 16};
  return m;
}

// A Qwen3ForCausalLM layout: head_dim 8 is not hidden / heads (as in Qwen3, 128 against 2560/32).
inline TinyLM tiny_qwen3(int64_t layers = 2) {
  TinyLM m;
  m.config_json = R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 64,
    "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": )" +
                  std::to_string(layers) + R"(, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "tie_word_embeddings": false, "hidden_act": "silu"})";
  const DecoderLMConfig c = DecoderLMConfig::from_json(io::JsonConfig::from_string(m.config_json, "tiny qwen3"));
  add_language_model(m.shapes, "model.", c);
  m.shapes["lm_head.weight"] = {c.vocab_size, c.hidden_size};
  return m;
}

// Writes config.json and model.safetensors (generated f32 values) into a new temporary folder.
inline std::filesystem::path write_tiny_lm(const TinyLM& m, const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kiln_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << m.config_json;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [key, shape] : m.shapes)
    tensors.emplace_back(key, from_vector(det_param_values(key, shape), shape));
  io::save_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

// transformers' output_hidden_states (num_hidden_layers + 1 entries, the last one after the final
// norm) in double precision, [B][L·M] each. `weight(key)` gives a tensor's values (row-major).
// Positions are 0..L-1; query i attends key j when j <= i, mask[j] != 0 and (with Mistral's
// sliding window W) j > i - W; a query with no such key gets a zero attention output.
inline std::vector<std::vector<double>> reference_hidden_states(
    const DecoderLMConfig& c, const std::string& prefix, const std::function<std::vector<float>(const std::string&)>& weight,
    const std::vector<int64_t>& ids, const std::vector<int64_t>& mask, int64_t B, int64_t L) {
  const int64_t M = c.hidden_size, hd = c.head_dim, H = c.num_attention_heads, Hkv = c.num_key_value_heads,
                F = c.intermediate_size, half = hd / 2;
  using Vec = std::vector<double>;
  const auto w = [&](const std::string& key) {
    const std::vector<float> f = weight(prefix + key);
    return Vec(f.begin(), f.end());
  };
  // y[r] = W x for W [out, in] (row-major), for each of `rows` rows of x.
  const auto linear = [](const Vec& W, const Vec& x, int64_t rows, int64_t in, int64_t out) {
    Vec y(size_t(rows * out), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) {
        double s = 0;
        for (int64_t i = 0; i < in; ++i) s += W[size_t(o * in + i)] * x[size_t(r * in + i)];
        y[size_t(r * out + o)] = s;
      }
    return y;
  };
  const auto rms = [&](const Vec& x, const Vec& g, int64_t rows, int64_t n) {
    Vec y(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      double ms = 0;
      for (int64_t i = 0; i < n; ++i) ms += x[size_t(r * n + i)] * x[size_t(r * n + i)];
      const double inv = 1.0 / std::sqrt(ms / double(n) + c.rms_norm_eps);
      for (int64_t i = 0; i < n; ++i) y[size_t(r * n + i)] = x[size_t(r * n + i)] * inv * g[size_t(i)];
    }
    return y;
  };
  // RoPE on rows [L, heads, hd] of one sequence, in place: x·cos + rotate_half(x)·sin.
  const auto rope = [&](Vec& x, int64_t heads) {
    for (int64_t p = 0; p < L; ++p)
      for (int64_t h = 0; h < heads; ++h) {
        double* r = &x[size_t((p * heads + h) * hd)];
        for (int64_t k = 0; k < half; ++k) {
          const double a = double(p) * std::pow(c.rope_theta, -2.0 * double(k) / double(hd));
          const double x1 = r[k], x2 = r[k + half];
          r[k] = x1 * std::cos(a) - x2 * std::sin(a);
          r[k + half] = x2 * std::cos(a) + x1 * std::sin(a);
        }
      }
  };

  std::vector<Vec> out;
  std::vector<Vec> h(static_cast<size_t>(B));
  const Vec E = w("embed_tokens.weight");
  for (int64_t b = 0; b < B; ++b) {
    h[size_t(b)].resize(size_t(L * M));
    for (int64_t t = 0; t < L; ++t)
      for (int64_t i = 0; i < M; ++i) h[size_t(b)][size_t(t * M + i)] = E[size_t(ids[size_t(b * L + t)] * M + i)];
  }
  const auto record = [&] {
    Vec all;
    for (const Vec& x : h) all.insert(all.end(), x.begin(), x.end());
    out.push_back(all);
  };
  record();
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string l = "layers." + std::to_string(layer) + ".";
    const Vec g1 = w(l + "input_layernorm.weight"), g2 = w(l + "post_attention_layernorm.weight");
    const Vec Wq = w(l + "self_attn.q_proj.weight"), Wk = w(l + "self_attn.k_proj.weight"),
              Wv = w(l + "self_attn.v_proj.weight"), Wo = w(l + "self_attn.o_proj.weight");
    const Vec Wg = w(l + "mlp.gate_proj.weight"), Wu = w(l + "mlp.up_proj.weight"), Wd = w(l + "mlp.down_proj.weight");
    for (int64_t b = 0; b < B; ++b) {
      Vec& x = h[size_t(b)];
      const Vec a = rms(x, g1, L, M);
      Vec q = linear(Wq, a, L, M, H * hd), k = linear(Wk, a, L, M, Hkv * hd);
      const Vec v = linear(Wv, a, L, M, Hkv * hd);
      if (c.qk_norm()) {
        q = rms(q, w(l + "self_attn.q_norm.weight"), L * H, hd);
        k = rms(k, w(l + "self_attn.k_norm.weight"), L * Hkv, hd);
      }
      rope(q, H);
      rope(k, Hkv);
      Vec attn(size_t(L * H * hd), 0.0);
      for (int64_t hh = 0; hh < H; ++hh) {
        const int64_t kvh = hh / (H / Hkv);
        for (int64_t i = 0; i < L; ++i) {
          Vec s(size_t(L), -INFINITY);
          double mx = -INFINITY;
          for (int64_t j = 0; j <= i; ++j) {
            if (mask[size_t(b * L + j)] == 0 || (c.sliding_window && j <= i - *c.sliding_window)) continue;
            double dot = 0;
            for (int64_t d = 0; d < hd; ++d) dot += q[size_t((i * H + hh) * hd + d)] * k[size_t((j * Hkv + kvh) * hd + d)];
            s[size_t(j)] = dot / std::sqrt(double(hd));
            mx = std::max(mx, s[size_t(j)]);
          }
          if (mx == -INFINITY) continue;  // no key to attend: zeros
          double sum = 0;
          for (double& e : s) sum += (e = std::exp(e - mx));
          for (int64_t j = 0; j < L; ++j)
            for (int64_t d = 0; d < hd; ++d)
              attn[size_t((i * H + hh) * hd + d)] += s[size_t(j)] / sum * v[size_t((j * Hkv + kvh) * hd + d)];
        }
      }
      const Vec o = linear(Wo, attn, L, H * hd, M);
      for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      const Vec n = rms(x, g2, L, M);
      const Vec gate = linear(Wg, n, L, M, F), up = linear(Wu, n, L, M, F);
      Vec act(gate.size());
      for (size_t i = 0; i < act.size(); ++i) act[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
      const Vec d = linear(Wd, act, L, F, M);
      for (size_t i = 0; i < x.size(); ++i) x[i] += d[i];
    }
    if (layer + 1 < c.num_hidden_layers) record();
  }
  const Vec g = w("norm.weight");
  for (Vec& x : h) x = rms(x, g, L, M);
  record();
  return out;
}

}  // namespace kiln::test
