// Who owns a running run, and whether that owner is still alive. A run records the owner's pid,
// its start time in clock ticks since boot (/proc/PID/stat field 22), the boot id and the host
// name; a pid reused by another process, a reboot or a zombie all read as "dead". Runs of
// another host cannot be judged and read as alive. Linux /proc only; no signals are sent.
#pragma once

#include <cstdint>
#include <string>

namespace kv::storage {

struct ProcessIdentity {
    int64_t pid = 0;
    int64_t start_ticks = 0;  // 0 = unknown
    std::string boot_id;
    std::string host;
};

ProcessIdentity this_process();
// False only when the owner is certainly gone (same host and boot, and the pid is missing, a
// zombie, or belongs to a process started at another time).
bool process_alive(const ProcessIdentity& owner);

}  // namespace kv::storage
