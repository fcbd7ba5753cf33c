// `kvlab generate MODEL --prompt "..."`: prefill the prompt, then stream generated text to
// stdout as it is decoded (sampling, top-k/top-p, beam search, stop tokens and strings).
#include "commands.h"
#include "run_options.h"
#include "run_session.h"

namespace kv::cli {

int cmd_generate(int argc, char** argv, int first) {
    Args args(argc, argv, first, run_option_specs());
    if (args.flag("help")) {
        print_run_help("generate");
        return 0;
    }
    apply_global_options(args);
    if (args.positional().empty()) throw UsageError("generate: missing MODEL; expected e.g. kvlab generate tiny --prompt hello");
    return run_mode_in_session(args, "generate");
}

}  // namespace kv::cli
