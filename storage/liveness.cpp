// Process liveness from /proc (see liveness.h). Reads only; never signals or waits for the
// process it asks about.
#include "liveness.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace kv::storage {

namespace {
std::string read_line(const std::string& path) {
    std::ifstream f(path);
    std::string s;
    std::getline(f, s);
    return s;
}

// State letter and start time (field 22) of /proc/PID/stat; false when the process is gone.
bool read_stat(int64_t pid, char* state, int64_t* start_ticks) {
    std::string s = read_line("/proc/" + std::to_string(pid) + "/stat");
    if (s.empty()) return false;
    // The command name (field 2) is in parentheses and may contain spaces: parse after the
    // last ')'.
    size_t rp = s.rfind(')');
    if (rp == std::string::npos) return false;
    std::istringstream in(s.substr(rp + 1));
    std::string field;
    in >> field;  // field 3: state
    *state = field.empty() ? '?' : field[0];
    for (int i = 4; i <= 22; ++i) in >> field;  // fields 4..22
    *start_ticks = std::atoll(field.c_str());
    return true;
}
}  // namespace

ProcessIdentity this_process() {
    ProcessIdentity p;
    p.pid = int64_t(getpid());
    char state = 0;
    read_stat(p.pid, &state, &p.start_ticks);
    p.boot_id = read_line("/proc/sys/kernel/random/boot_id");
    char host[256] = {0};
    if (gethostname(host, sizeof host - 1) == 0) p.host = host;
    return p;
}

bool process_alive(const ProcessIdentity& owner) {
    if (owner.pid <= 0) return false;
    ProcessIdentity me = this_process();
    if (!owner.host.empty() && owner.host != me.host) return true;                                   // cannot tell
    if (!owner.boot_id.empty() && !me.boot_id.empty() && owner.boot_id != me.boot_id) return false;  // rebooted
    char state = 0;
    int64_t start = 0;
    if (!read_stat(owner.pid, &state, &start)) return false;
    if (state == 'Z' || state == 'X') return false;
    if (owner.start_ticks && start != owner.start_ticks) return false;  // pid reused
    return true;
}

}  // namespace kv::storage
