#include "help.h"

#include <algorithm>
#include <deque>

#include "core/env.h"
#include "core/error.h"
#include "pipelines/call_arguments.h"
#include "random_checkpoint/like_recipe.h"

namespace kiln::cli {

namespace {

// "-p, --prompt": a call argument's aliases before its flag (kept for the program's life: the
// docs hold pointers into them).
const char* flag_with_aliases(const CallArgument& a) {
  static std::deque<std::string> labels;
  std::string label;
  for (const CallArgumentAlias& alias : call_argument_aliases())
    if (alias.name == std::string(a.name)) label += std::string(alias.flag) + ", ";
  return labels.emplace_back(label + a.flag).c_str();
}

// generate's flags: `before`, every pipeline call argument's row (pipelines/call_arguments.h), `after`.
std::vector<FlagDoc> with_call_arguments(std::vector<FlagDoc> before, const std::vector<FlagDoc>& after) {
  for (const CallArgument& a : call_arguments())
    before.push_back({flag_with_aliases(a), a.metavar, a.shown_default, a.help});
  before.insert(before.end(), after.begin(), after.end());
  return before;
}

// The edit distance of two flags (insertions, deletions, substitutions).
size_t distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

const std::vector<CommandDoc>& commands() {
  // --like's values. A data folder that cannot be read is make-random's and plan's error to
  // report (naming the file), not a reason for every command's help to fail.
  static const std::string likes = [] {
    try {
      return random_weights::like_names_joined("|");
    } catch (const Error&) {
      return std::string("NAME");
    }
  }();
  static const std::vector<CommandDoc> docs = {
      {"generate",
       "Text to image with a checkpoint in Diffusers layout: the pipeline class its model_index.json names "
       "(FluxPipeline: FLUX.1; StableDiffusion3Pipeline: SD3 / SD3.5; Flux2Pipeline: FLUX.2 dev; "
       "Flux2KleinPipeline: FLUX.2 klein). Without --model it runs the small FLUX.1 checkpoint bundled with kiln "
       "(128x128, 4 steps).",
       with_call_arguments(
           {{"--model", "DIR|REPO_ID", "the bundled checkpoint",
             "a Diffusers folder, a Hugging Face cache folder (models--org--name or a snapshot), or a Hub repo id "
             "already in the cache (black-forest-labs/FLUX.1-schnell, or its short name flux1-schnell; kiln list "
             "shows them; kiln never downloads)"}},
           {
           {"--from-png", "FILE", "", "start from the call and load options a kiln PNG recorded (its 'kiln' chunk): "
                                     "the same image; any other flag overrides what it recorded"},
           {"--latents", "FILE[:TENSOR]", "", "initial noise from a safetensors file: the tensor 'latents', the only "
                                              "one, or TENSOR"},
           {"-o, --output", "FILE", "out.png", "the PNG (--out too), written atomically; symlinks are followed; "
                                                "devices, FIFOs, sockets and folders are refused"},
           {"--report", "FILE", "", "a JSON run report (timings, counters, memory), same rules as --out"},
           {"--profile", "", "off", "with --report: time every kernel; the report gains profile.by_op (seconds, launches and "
                                "bytes moved per op, per component)"},
           {"--device", "DEVICE", "cpu", "cpu; cuda:N (a build with the CUDA toolkit, on a machine with that GPU); "
                                        "pjrt (a PJRT plugin: XLA's CPU plugin unless --pjrt-plugin); tpu (libtpu)"},
           {"--pjrt-plugin", "PATH", "XLA's CPU plugin", "with --device pjrt: the PJRT plugin .so to load (a GPU or "
                                                          "other accelerator's; KILN_PJRT_PLUGIN does the same)"},
           {"--mode", "eager|defer|compile", "eager", "strict eager, deferred-and-fused, or compiled transformer"},
           {"--compile", "full|blocks", "full", "with --mode compile: the whole transformer or its repeated blocks"},
           {"--prepack", "on|off", "on", "with --mode compile: linears read pre-packed weights"},
           {"--offload", "none|model", "weights read in place", "none: every component on the device; model: one "
                                                                  "component at a time"},
           {"--device-memory", "SIZE", "unlimited", "the device's capacity (6GiB, 512MiB, 2GB); a call that "
                                                    "cannot fit fails before any work"},
           {"--tp", "N", "1", "shard the transformer over the N processes of mpirun -np N, or with --device pjrt "
                              "over N devices of this process"},
           {"--threads", "N", "every core (OMP_NUM_THREADS)", "at most N threads per parallel kernel (1 to 1024)"},
           {"--verbose", "", "off", "print each phase's progress (component loads, onloads, encoders, decode) also when "
                                   "stderr is not a terminal"},
           {"--strict", "", "off", "a checkpoint tensor the model does not use is an error, not a warning"},
           {"--dtype", "auto|bf16|f16|f32[,COMPONENT=DTYPE...]", "auto",
            "torch_dtype: weights held and computed in it; auto = the checkpoint's (bf16 weights stay bf16, read in "
            "place); per component: e.g. bf16,vae=f32"},
           {"--quantize", "TYPE|COMPONENT=TYPE[,...]", "off",
            "quantize linear weights at load: q8_0, q4_k, q5_k, q4_0 (ggml blocks) or f8_e4m3 / f8_e5m2; a bare TYPE "
            "is the transformer's (e.g. q8_0, or transformer=q4_k,text_encoder_2=q8_0)"},
           {"--transformer", "FILE", "the folder's", "the transformer's weights from one file: GGUF (kiln convert, "
                                                     "city96 / stable-diffusion.cpp) or safetensors, in Diffusers or "
                                                     "the original single-file (BFL / Stability / ComfyUI) names; "
                                                     "quantized tensors stay quantized; config from --model"},
           {"--vae", "FILE", "the folder's", "as --transformer, for the VAE (LDM names too)"},
           {"--text-encoder", "FILE", "the folder's", "as --transformer (also --text-encoder-2, --text-encoder-3)"},
           {"--help", "", "", "this text"},
           })},
      {"convert",
       "Write a pipeline's transformer as one file: quantized (--quantize) into GGUF, so the next run loads it in "
       "place with --transformer FILE instead of quantizing again.",
       {
           {"--model", "DIR", "required", "the Diffusers folder to read"},
           {"--quantize", "TYPE", "required", "q8_0, q4_k, q5_k, q4_0 (GGUF), or f8_e4m3 / f8_e5m2 (safetensors)"},
           {"--dtype", "auto|bf16|f16|f32", "auto", "the dtype of the tensors left unquantized"},
           {"--out", "FILE", "required", "FILE.gguf (ggml block types) or FILE.safetensors (fp8); written atomically"},
           {"--threads", "N", "every core", "as for generate (quantizing is parallel)"},
           {"--layout", "diffusers|original", "diffusers", "the tensor names: Diffusers', or the original single-file "
                                                         "ones (BFL / Stability; GGUF only), which stable-diffusion.cpp "
                                                         "and ComfyUI loaders read"},
           {"--help", "", "", "this text"},
       }},
      {"serve",
       "Serve image generation over HTTP with the pipeline loaded (and compiled) once: the OpenAI images API "
       "(POST /v1/images/generations), jobs with progress events and cancellation (/v1/jobs), /health, /v1/models, "
       "Prometheus /metrics and a page at /. Runs until SIGTERM, SIGINT or SIGUSR1 (under mpirun: SIGUSR1 to "
       "mpirun, which forwards it; docs/server.md).",
       {
           {"--model", "DIR", "the bundled checkpoint", "as for generate"},
           {"--host", "ADDRESS", "127.0.0.1", "the address to listen on; one other machines reach needs --api-key"},
           {"--port", "N", "7860", "the port; 0: any free one (printed at start); a port in use fails"},
           {"--allowed-hosts", "NAME[,NAME...]", "none", "without --api-key: more names the Host and Origin headers "
                                                         "may give (loopback names and the bound address always)"},
           {"--threads", "N", "every core", "as for generate"},
           {"--api-key", "KEY", "none", "every route but / and /health needs Authorization: Bearer KEY"},
           {"--max-queue", "N", "16", "jobs that may wait; more are refused with 429 and Retry-After"},
           {"--keep-jobs", "N", "64", "finished jobs kept readable (state, events, images); older ones are forgotten"},
           {"--max-n", "N", "4", "images per request"},
           {"--max-size", "PIXELS", "2048", "the largest image side a request may ask for"},
           {"--max-steps", "N", "100", "the most steps a request may ask for"},
           {"--max-prompt-bytes", "N", "4096", "the longest prompt (each prompt field)"},
           {"--max-body", "SIZE", "1MiB", "the largest request body, chunked or not (413 above, the rest unread)"},
           {"--timeout", "SECONDS", "30", "a request must arrive whole, and an answer be taken, within this"},
           {"--max-connections", "N", "1024", "open connections in all"},
           {"--max-client-connections", "N", "256", "open connections from one address; over a limit the oldest one "
                                                    "still sending its request is closed"},
           {"--on-stop", "finish|cancel", "finish", "SIGTERM/SIGINT/SIGUSR1: the running job finishes, or stops at its "
                                                   "next step; queued jobs are answered as cancelled either way"},
           {"--warmup", "HxW[,HxW...]", "none", "run one step at each size (HEIGHTxWIDTH, as warmup --sizes) before "
                                               "listening: compiled executables are built before the first request"},
           {"--mode", "eager|defer|compile", "eager", "as for generate"},
           {"--compile", "full|blocks", "full", "as for generate"},
           {"--offload", "none|model", "weights read in place", "as for generate"},
           {"--device-memory", "SIZE", "unlimited", "as for generate: a job that cannot fit fails alone"},
           {"--dtype", "auto|bf16|f16|f32[,COMPONENT=DTYPE...]", "auto", "as for generate"},
           {"--quantize", "TYPE|COMPONENT=TYPE[,...]", "off", "as for generate"},
           {"--transformer", "FILE", "the folder's", "as for generate (also --vae, --text-encoder[-2|-3])"},
           {"--text-encoder-out-layers", "I,J,K", "FLUX.2-dev 10,20,30; klein 9,18,27",
            "FLUX.2: the text encoder layers loaded, and the requests' default (a request may name others up to the "
            "largest)"},
           {"--strict", "", "off", "as for generate"},
           {"--tp", "N", "1", "as for generate (mpirun -np N kiln serve --tp N): rank 0 serves, every rank runs each "
                              "request on its shard"},
           {"--help", "", "", "this text"},
       }},
      {"warmup",
       "Compile the transformer for each size without running it and store the executables in the persistent "
       "cache, so later runs at those sizes compile nothing.",
       {
           {"--sizes", "HxW[,HxW...]", "required", "the sizes to compile for (at most 256; sides 16 to 1048576)"},
           {"--model", "DIR", "the bundled checkpoint", "as for generate"},
           {"--compile", "full|blocks", "full", "the whole transformer or its repeated blocks"},
           {"--max-sequence-length", "N", "the pipeline's: FLUX 512, SD3 256 (32 for the bundled checkpoint)",
            "T5 tokens the executables are compiled for"},
           {"--dtype", "auto|bf16|f16|f32[,COMPONENT=DTYPE...]", "auto", "as for generate (executables are per dtype)"},
           {"--report", "FILE", "", "a JSON report of the compiles"},
           {"--help", "", "", "this text"},
       }},
      {"inspect",
       "Load a Diffusers model folder (model_index.json, each component's config and safetensors weights, "
       "zero-copy) and print what it holds.",
       {
           {"--model", "DIR", "the bundled checkpoint", "as for generate"},
           {"--report", "FILE", "", "a JSON report"},
           {"--help", "", "", "this text"},
       }},
      {"make-random",
       "Write a complete Diffusers FLUX.1, Stable Diffusion 3 / 3.5 Medium or FLUX.2 folder at DIR with "
       "deterministic random weights at the real widths (configs as on the Hub, bundled tokenizers), to measure "
       "speed and memory without the download. Weights are streamed to disk; DIR must be new or empty and is only "
       "created once every file is written.",
       {
           {"--like", likes.c_str(),
            "required",
            "the checkpoint to imitate (flux1-dev adds the guidance embedding and the scheduler's dynamic shifting; "
            "sd3.5-medium adds dual attention in blocks 0-12, QK RMSNorm and a 384x384 positional table to "
            "sd3-medium's transformer; flux2-dev: Mistral Small 3.2 text encoder, 6144-wide transformer; "
            "flux2-klein-4b / -9b: Qwen3-4B / Qwen3-8B text encoder, 3072 / 4096-wide transformer, step-distilled)"},
           {"--blocks", "D+S | N", "19+38 (FLUX.1), 24 (SD3), 8+48 (flux2-dev), 5+20 / 8+24 (klein 4b / 9b)",
            "FLUX.1, FLUX.2: double-stream + single-stream transformer blocks; SD3: transformer blocks N >= 1 (each "
            "count at most 1000; the "
            "last is the context-pre-only block; sd3.5-medium's dual-attention blocks are those of 0-12 below N)"},
           {"--t5-layers", "N", "24", "FLUX.1, SD3: T5 encoder layers"},
           {"--text-encoder-layers", "N", "40 (flux2-dev), 36 (klein)",
            "FLUX.2: the language model's decoder layers; generate's default --text-encoder-out-layers need 30 "
            "(dev) / 27 (klein): with fewer, pass three indices of at most N (e.g. 1,2,3 for N = 3)"},
           {"--dtype", "bf16|f16|f32", "bf16", "the stored dtype of every weight"},
           {"--seed", "S", "0", "the weights' seed: the same seed writes the same bytes"},
           {"--layout-only", "", "off", "write no values: every tensor is a hole in its file (no disk space, reads "
                                         "as zeros), a folder only for kiln plan --model"},
           {"--help", "", "", "this text"},
       }},
      {"plan",
       "The memory a pipeline call needs on a device, without running it or reading any weight: per component, "
       "with every component on the device and with model offload, and whether that fits. --device tpu compiles "
       "every component ahead of time with libtpu for a TPU topology (no TPU needed) and reports XLA's own "
       "figures (arguments, outputs, temporaries, code per device). Exits 1, naming the flag that would fit, when "
       "the chosen placement does not fit.",
       {
           {"--model", "DIR", "", "a Diffusers folder (its weights are never read)"},
           {"--like", likes.c_str(), "",
            "a configuration make-random knows, planned from a layout-only folder (no weights needed)"},
           {"--height", "H", "the pipeline's default (1024)", "image height"},
           {"--width", "W", "the pipeline's default (1024)", "image width"},
           {"--max-sequence-length", "N", "the pipeline's default", "text tokens"},
           {"--dtype", "auto|bf16|f16|f32[,COMPONENT=DTYPE...]", "bf16", "as generate's --dtype"},
           {"--quantize", "TYPE|COMPONENT=TYPE,...", "none", "as generate's --quantize (local devices only)"},
           {"--offload", "none|model", "none", "the placement whose fit decides the exit code (both are printed)"},
           {"--tp", "N", "1", "tensor parallelism over N devices: each holds its slices, collectives in the programs"},
           {"--device", "cpu|pjrt|cuda:N|tpu", "cpu", "the device to plan for"},
           {"--topology", "GENERATION:SHAPE", "", "with --device tpu: the chips (v6e:1x1, v6e:2x2, v6e:2x4, v5e:2x2, "
                                                  "v5p:2x2x1, ...)"},
           {"--report", "FILE", "", "the plan as JSON (fits, per component bytes, per program bytes, compile seconds)"},
           {"--dump", "DIR", "", "with --device tpu: the StableHLO of every component's program, COMPONENT.mlir"},
           {"--device-memory", "SIZE", "the device's", "a local device's capacity to plan against (6GiB, 512MiB)"},
           {"--help", "", "", "this text"},
       }},
      {"list",
       "The models in the Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub): "
       "repo id, pipeline class, size on disk, and whether kiln runs it (generate --model REPO_ID) or why not.",
       {
           {"--help", "", "", "this text"},
       }},
      {"compare",
       "Compare two PNG images channel value by channel value (e.g. a kiln image and Diffusers' image.png of a "
       "fixture); exits 1 when they differ by more than the tolerance.",
       {
           {"--tolerance", "LEVELS", "1", "the largest difference (of 255) still counted as the same image"},
           {"--help", "", "", "this text"},
       }},
  };
  return docs;
}

std::string closest_flag(const CommandDoc& doc, const std::string& flag) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, flag.size() / 4) + 1;  // further than this is no typo
  for (const FlagDoc& f : doc.flags) {
    const std::string label = f.flag;  // "-p, --prompt": each spelling
    for (size_t start = 0; start < label.size();) {
      const size_t comma = std::min(label.find(", ", start), label.size());
      const std::string spelling = label.substr(start, comma - start);
      // A long flag with one dash (-steps) is that flag; a short one is never guessed from a long.
      const size_t d = spelling.size() > 2 ? distance(flag, spelling) : (flag == spelling ? 0 : best_distance);
      if (d < best_distance) best = spelling, best_distance = d;
      start = comma + 2;
    }
  }
  return best;
}

void unknown_flag(const std::string& command, const std::string& flag) {
  const CommandDoc* doc = command_doc(command);
  const std::string guess = doc ? closest_flag(*doc, flag) : "";
  fail("cli", "unknown flag '", flag, "' for ", command, " (", guess.empty() ? "" : "did you mean " + guess + "? ",
       "see kiln ", command, " --help)");
}

const CommandDoc* command_doc(const std::string& name) {
  for (const CommandDoc& d : commands())
    if (name == d.name) return &d;
  return nullptr;
}

bool wants_help(const std::vector<std::string>& args) {
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

void print_command_help(const CommandDoc& doc, std::FILE* out) {
  const std::string name = doc.name;
  std::fprintf(out, "usage: kiln %s%s [options]\n\n%s\n\noptions:\n", doc.name,
               name == "compare" ? " A.png B.png" : name == "make-random" ? " DIR" : "", doc.summary);
  for (const FlagDoc& f : doc.flags) {
    std::string left = std::string("  ") + f.flag + (*f.value ? std::string(" ") + f.value : "");
    if (left.size() < 34) left.append(34 - left.size(), ' ');
    else left += "\n" + std::string(34, ' ');
    std::fprintf(out, "%s%s", left.c_str(), f.meaning);
    if (*f.default_value) std::fprintf(out, " (default: %s)", f.default_value);
    std::fprintf(out, "\n");
  }
  std::fprintf(out, "\nenvironment (read once at start):\n%s", env::help().c_str());
}

void print_usage(std::FILE* out) {
  std::fprintf(out, "kiln %s — diffusion pipelines in C++\n\nusage: kiln <command> [options]\n\ncommands:\n",
               KILN_VERSION);
  for (const CommandDoc& d : commands()) std::fprintf(out, "  %-12s %s\n", d.name, d.summary);
  std::fprintf(out,
               "\n  kiln <command> --help   that command's flags and their defaults\n"
               "  kiln --version          the engine version\n\nenvironment (read once at start):\n%s",
               env::help().c_str());
}

}  // namespace kiln::cli
