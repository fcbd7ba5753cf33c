// `kvlab generate MODEL --prompt "..."`: prefill the prompt, then stream generated text to
// stdout as it is decoded (sampling, top-k/top-p, beam search, stop tokens and strings).
#include <cstdio>

#include "commands.h"
#include "engine/core/error.h"
#include "engine/generate/generator.h"
#include "engine/model/model_loader.h"
#include "run_options.h"

namespace kv::cli {

ModelOptions model_options_for(const RunConfig& cfg);

namespace {
// Chat formats we can build without a template engine: ChatML (SmolLM2, Qwen) and Llama 3.
std::string chat_prompt(const Tokenizer& tok, const std::string& user) {
    if (tok.token_id("<|im_start|>") >= 0)
        return "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n";
    if (tok.token_id("<|start_header_id|>") >= 0)
        return "<|start_header_id|>user<|end_header_id|>\n\n" + user + "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
    throw UsageError("--chat: this tokenizer has no ChatML or Llama 3 chat tokens; drop --chat");
}
}  // namespace

int cmd_generate(int argc, char** argv, int first) {
    Args args(argc, argv, first, run_option_specs());
    if (args.flag("help")) {
        print_run_help("generate");
        return 0;
    }
    apply_global_options(args);
    if (args.positional().empty()) throw UsageError("generate: missing MODEL; expected e.g. kvlab generate tiny --prompt hello");
    RunConfig cfg = run_config_from_args(args, "generate");
    LoadedModel lm = load_model(cfg.model, model_options_for(cfg), cfg.model_seed);
    const std::string text = cfg.generate.chat ? chat_prompt(*lm.tokenizer, cfg.generate.prompt) : cfg.generate.prompt;
    std::vector<int32_t> prompt = lm.tokenizer->encode(text, true);
    GenerationCallbacks cb;
    cb.on_text = [](const std::string& piece) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
    };
    GenerationResult r = generate(*lm.model, *lm.tokenizer, prompt, cfg.generate, cfg.kv_cache, cb);
    std::printf("\n");
    std::fprintf(stderr, "[%lld prompt tokens in %.2fs, %zu generated in %.2fs (%.1f tokens/s), stopped: %s]\n",
                 (long long)r.prompt_tokens, r.prefill_seconds, r.tokens.size(), r.decode_seconds,
                 r.decode_seconds > 0 ? double(r.tokens.size()) / r.decode_seconds : 0.0, r.stop_reason.c_str());
    return 0;
}

}  // namespace kv::cli
