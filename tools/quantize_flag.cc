// --quantize: quantization at load, per component (default: the transformer only).
#include <cctype>

#include "commands.h"
#include "core/error.h"
#include "pipelines/diffusion_pipeline.h"

namespace kiln::cli {

namespace {

DType quant_value(const std::string& flag_value, const std::string& spelled) {
  // ggml's own spelling (Q8_0, Q4_K) and any other case name the same type.
  std::string v = spelled;
  for (char& c : v) c = char(std::tolower(static_cast<unsigned char>(c)));
  const std::optional<DType> t = dtype_from_name(v == "fp8" ? "f8_e4m3" : v);
  KILN_CHECK(t && is_storage_only(*t), "cli", "--quantize ", flag_value, ": '", spelled,
             "' is not a quantization; expected q8_0, q4_0, q4_k, q5_k, f8_e4m3 (fp8) or f8_e5m2");
  return *t;
}

}  // namespace

void parse_quantize(const std::string& value, PipelineOptions& options) {
  KILN_CHECK(!value.empty(), "cli", "--quantize \"\": expected a type (q8_0, q4_k, ...) for the transformer, or "
                                    "COMPONENT=TYPE entries (e.g. transformer=q4_k,text_encoder_2=q8_0)");
  size_t start = 0;
  while (start <= value.size()) {
    const size_t comma = value.find(',', start);
    const std::string part = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t eq = part.find('=');
    // The pipeline checks component names before it loads anything (from_pretrained).
    const std::string component = eq == std::string::npos ? "transformer" : part.substr(0, eq);
    KILN_CHECK(!options.quantize.count(component), "cli", "--quantize ", value, ": ", component, " is given twice");
    options.quantize[component] = quant_value(value, eq == std::string::npos ? part : part.substr(eq + 1));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}

}  // namespace kiln::cli
