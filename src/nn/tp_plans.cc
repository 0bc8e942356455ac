#include "nn/tp_plans.h"

namespace kiln::nn {

TensorParallelPlan self_attention_plan(const std::string& attn) {
  return {{attn + ".to_q", "colwise", {}},
          {attn + ".to_k", "colwise", {}},
          {attn + ".to_v", "colwise", {}},
          {attn + ".to_out.0", "rowwise", {}}};
}

TensorParallelPlan joint_attention_plan(const std::string& attn) {
  return concat_plans({self_attention_plan(attn),
                       {{attn + ".add_q_proj", "colwise", {}},
                        {attn + ".add_k_proj", "colwise", {}},
                        {attn + ".add_v_proj", "colwise", {}},
                        {attn + ".to_add_out", "rowwise", {}}}});
}

TensorParallelPlan feed_forward_plan(const std::string& ff) {
  return {{ff + ".net.0.proj", "colwise", {}}, {ff + ".net.2", "rowwise", {}}};
}

TensorParallelPlan gathered_plan(std::initializer_list<const char*> linears) {
  TensorParallelPlan plan;
  for (const char* l : linears) plan.push_back({l, "colwise_gather", {}});
  return plan;
}

TensorParallelPlan concat_plans(std::initializer_list<TensorParallelPlan> parts) {
  TensorParallelPlan plan;
  for (const TensorParallelPlan& p : parts) plan.insert(plan.end(), p.begin(), p.end());
  return plan;
}

}  // namespace kiln::nn
