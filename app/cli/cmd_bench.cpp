// `kvlab bench ...`: the benchmarks are their own program, kvlab-bench (app/bench/), built and
// installed beside kvlab, so kvlab links no benchmark code. kvlab runs it in its own place with
// the same arguments (one process: under mpirun the rank stays the same process).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "commands.h"

namespace kv::cli {

int cmd_bench(int argc, char** argv, int first) {
    std::error_code ec;
    std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) self = argv[0];
    std::string program = (self.parent_path() / "kvlab-bench").string();
    std::vector<char*> args{program.data()};
    for (int i = first; i < argc; ++i) args.push_back(argv[i]);
    args.push_back(nullptr);
    execv(program.c_str(), args.data());  // returns only when it could not run
    const int err = errno;
    std::fprintf(stderr,
                 "kvlab: bench: the benchmarks are the program kvlab-bench, expected beside kvlab at %s (%s)\n"
                 "  hint: build it with `cmake --build build --target kvlab-bench`, or install the package that has it\n",
                 program.c_str(), std::strerror(err));
    return 1;
}

}  // namespace kv::cli
