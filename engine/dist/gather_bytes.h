// Gathering each rank's bytes on rank 0 over the communicator (issue 23: the ranks' session
// files reach rank 0, which imports them into the run's session). Built on broadcast, which
// every backend has with its deadline: rank r's bytes go out in one broadcast per rank, so the
// other non-root ranks receive (and drop) them too. Fine for data parallelism's few ranks and
// telemetry files of megabytes; not a bulk transport.
#pragma once

#include <cstdint>
#include <vector>

#include "communicator.h"

namespace kv::dist {

struct RankBytes {
    uint64_t tag = 0;  // a number sent along (the rank's run id in its own session)
    std::vector<uint8_t> bytes;
};

// Collective: every rank calls it. On rank 0 the result holds every rank's tag and bytes
// (index = rank; its own included); elsewhere it is empty. Throws DistError (deadline, dead peer).
std::vector<RankBytes> gather_bytes_to_root(Communicator& comm, uint64_t tag, const std::vector<uint8_t>& mine, const char* what);

}  // namespace kv::dist
