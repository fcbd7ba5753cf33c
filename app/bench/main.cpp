// `kvlab-bench`: every benchmark of `kvlab bench ...` (kvlab runs this program in its place with
// the same arguments), so the kvlab executable and the product libraries hold no benchmark code.
// Usage: kvlab-bench ops|model|cache|... [options], as `kvlab bench`.
#include "app/cli/process_main.h"
#include "bench_commands.h"

int main(int argc, char** argv) {
    return kv::cli::guarded_main(argc, argv, [](int c, char** v) { return kv::cli::bench_main(c, v, 1); });
}
