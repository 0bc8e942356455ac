#include "nn/repeated_block.h"

#include "core/error.h"

namespace kiln::nn {

void compile_repeated_blocks(const std::string& model, const std::vector<std::string>& repeated,
                             const std::vector<CompilableBlock*>& blocks, const CompileOptions& options) {
  options.validate(model);
  std::vector<CompilableBlock*> chosen;
  for (CompilableBlock* b : blocks)
    for (const std::string& name : repeated)
      if (name == b->class_name()) chosen.push_back(b);
  std::string names;
  for (const std::string& name : repeated) names += (names.empty() ? "" : ", ") + name;
  KILN_CHECK(!chosen.empty(), model, "regional compilation failed because none of the repeated block classes (",
             names, ") was found in the model");
  for (CompilableBlock* b : chosen) b->compile(options);
}

}  // namespace kiln::nn
