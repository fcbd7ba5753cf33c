// Gathering bytes on rank 0 (see gather_bytes.h).
#include "gather_bytes.h"

namespace kv::dist {

std::vector<RankBytes> gather_bytes_to_root(Communicator& comm, uint64_t tag, const std::vector<uint8_t>& mine, const char* what) {
    const std::vector<uint64_t> sizes = comm.allgather_u64(mine.size(), what);
    const std::vector<uint64_t> tags = comm.allgather_u64(tag, what);
    const int me = comm.rank();
    std::vector<RankBytes> out;
    if (me == 0) out.resize(size_t(comm.size()));
    std::vector<uint8_t> scratch;
    for (int r = 1; r < comm.size(); ++r) {
        const size_t n = size_t(sizes[size_t(r)]);
        if (n == 0) continue;  // every rank knows the size: no broadcast to skip a rank with nothing
        uint8_t* p = nullptr;
        if (me == r) {
            p = const_cast<uint8_t*>(mine.data());  // a broadcast's root only reads its buffer
        } else {
            std::vector<uint8_t>& buf = me == 0 ? out[size_t(r)].bytes : scratch;
            buf.assign(n, 0);
            p = buf.data();
        }
        comm.broadcast(p, n, r, what);
    }
    if (me == 0) {
        out[0].bytes = mine;
        for (int r = 0; r < comm.size(); ++r) out[size_t(r)].tag = tags[size_t(r)];
    }
    return out;
}

}  // namespace kv::dist
