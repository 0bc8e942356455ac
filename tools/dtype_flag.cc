// --dtype: Diffusers' torch_dtype, per pipeline and per component.
#include "commands.h"
#include "core/error.h"
#include "pipelines/diffusion_pipeline.h"

namespace kiln::cli {

namespace {

// "auto" (std::nullopt) or a float dtype, as --dtype spells them.
std::optional<DType> dtype_value(const std::string& flag_value, const std::string& v) {
  if (v == "auto") return std::nullopt;
  if (v == "bf16" || v == "bfloat16") return DType::bf16;
  if (v == "f16" || v == "fp16" || v == "float16") return DType::f16;
  if (v == "f32" || v == "fp32" || v == "float32") return DType::f32;
  fail("cli", "--dtype ", flag_value, ": '", v, "' is not a dtype; expected auto, bf16, f16 or f32");
}

}  // namespace

void parse_dtype(const std::string& value, PipelineOptions& options) {
  KILN_CHECK(!value.empty(), "cli", "--dtype \"\": expected auto, bf16, f16 or f32 (optionally followed by "
                                    ",COMPONENT=DTYPE, e.g. bf16,vae=f32)");
  size_t start = 0;
  bool first = true;
  while (start <= value.size()) {
    const size_t comma = value.find(',', start);
    const std::string part = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t eq = part.find('=');
    if (eq == std::string::npos) {
      KILN_CHECK(first, "cli", "--dtype ", value, ": only the first entry may be a plain dtype; later ones are "
                                                  "COMPONENT=DTYPE (text_encoder, text_encoder_2, text_encoder_3 for SD3, transformer, vae)");
      options.dtype = dtype_value(value, part);
    } else {
      // The pipeline checks the name before it loads anything (from_pretrained).
      options.component_dtype[part.substr(0, eq)] = dtype_value(value, part.substr(eq + 1));
    }
    first = false;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}

}  // namespace kiln::cli
