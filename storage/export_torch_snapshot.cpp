// PyTorch memory snapshot export (see exports.h, reference/peers.md C.1): the dict
// torch.cuda.memory._snapshot() returns, pickled with PickleWriter, so pytorch.org/memory_viz
// draws our allocations (KV buffers, checkpoints, activations) and `pickle.load` reads them.
//   device_traces[d]: per allocation "segment_alloc" + "alloc", per release "free_completed" +
//                     "segment_free" -- one segment per block, since kvlab has no caching
//                     allocator whose segments could be shown;
//   segments:         the blocks still allocated when the recording ends.
// Trace index d enumerates the run's devices in order (cpu first, then cuda:N); the names are in
// the extra key "kvlab_devices". Frames name the allocation label, category, layer, chunk and
// the run's cache policy, which memory_viz shows on hover.
#include <map>
#include <set>

#include "storage/config_fields.h"
#include "storage/exports.h"
#include "storage/pickle_writer.h"

namespace kv::storage {

namespace {
struct Block {
    uint64_t addr = 0;
    int64_t size = 0;
    std::string frame_name, frame_file;
};

// Allocations with no address (accounted memory) or one that is already live get a synthetic
// address in an otherwise unused range, so blocks never overlap in the viewer.
constexpr uint64_t kSyntheticBase = 0x7e0000000000ull;

void write_frames(PickleWriter& p, const Block& b) {
    p.begin_list();
    p.begin_dict();
    p.key("name");
    p.str(b.frame_name);
    p.key("filename");
    p.str(b.frame_file);
    p.key("line");
    p.integer(0);
    p.end_dict();
    p.end_list();
}

void write_entry(PickleWriter& p, const char* action, const Block& b, int64_t time_us) {
    p.begin_dict();
    p.key("action");
    p.str(action);
    p.key("addr");
    p.integer(int64_t(b.addr));
    p.key("size");
    p.integer(b.size);
    p.key("stream");
    p.integer(0);
    p.key("time_us");
    p.integer(time_us);
    p.key("frames");
    write_frames(p, b);
    p.end_dict();
}
}  // namespace

uint64_t export_torch_snapshot(SessionReader& reader, int64_t run, std::ostream& out) {
    const RunInfo info = reader.run(run);
    const std::string policy = run_config_value(info.config, "kv_cache.name");
    const std::vector<int> devices = reader.memory_devices(run);
    uint64_t entries = 0;
    uint64_t next_synthetic = kSyntheticBase;
    std::vector<std::map<int64_t, Block>> live(devices.size());  // per device: alloc_id -> block

    PickleWriter p(out);
    p.begin_dict();
    p.key("device_traces");
    p.begin_list();
    for (size_t d = 0; d < devices.size(); ++d) {
        std::set<uint64_t> live_addr;
        p.begin_list();
        reader.for_each_memory_event(run, {}, [&](const MemoryEventRow& r) {
            if (r.device != devices[d] || (r.flags & trace::ALLOC_FLAGS_BASELINE) || r.bytes == 0) return;
            const int64_t time_us = (r.t_ns - info.t0_ns) / 1000;
            if (r.bytes > 0) {
                Block b;
                b.size = r.bytes;
                b.addr = r.address;
                if (b.addr == 0 || live_addr.count(b.addr)) {
                    b.addr = next_synthetic;
                    next_synthetic += (uint64_t(r.bytes) + 511) & ~uint64_t(511);
                }
                b.frame_name = r.label.empty() ? std::string(mem_category_name(r.category)) : r.label;
                b.frame_file =
                    str(mem_category_name(r.category), r.layer >= 0 ? str(" layer=", r.layer) : "",
                        r.chunk >= 0 ? str(" chunk=", r.chunk) : "", policy.empty() ? "" : " policy=" + policy,
                        " run=", run, " ", trace::device_code_name(r.device));
                live_addr.insert(b.addr);
                write_entry(p, "segment_alloc", b, time_us);
                write_entry(p, "alloc", b, time_us);
                live[d][r.alloc_id] = std::move(b);
                entries += 2;
            } else {
                Block b;
                auto it = live[d].find(r.alloc_id);
                if (it != live[d].end()) {
                    b = std::move(it->second);
                    live[d].erase(it);
                    live_addr.erase(b.addr);
                } else {
                    // Allocated before recording began: memory_viz shows it as initially allocated.
                    b.size = -r.bytes;
                    b.addr = r.address ? r.address : next_synthetic;
                    if (!r.address) next_synthetic += (uint64_t(-r.bytes) + 511) & ~uint64_t(511);
                    b.frame_name = r.label;
                    b.frame_file = str(mem_category_name(r.category), " (allocated before recording)");
                }
                write_entry(p, "free_completed", b, time_us);
                write_entry(p, "segment_free", b, time_us);
                entries += 2;
            }
        });
        p.end_list();
    }
    p.end_list();

    p.key("segments");
    p.begin_list();
    for (size_t d = 0; d < devices.size(); ++d) {
        for (const auto& [id, b] : live[d]) {
            p.begin_dict();
            p.key("device");
            p.integer(int64_t(d));
            p.key("address");
            p.integer(int64_t(b.addr));
            p.key("total_size");
            p.integer(b.size);
            p.key("allocated_size");
            p.integer(b.size);
            p.key("active_size");
            p.integer(b.size);
            p.key("requested_size");
            p.integer(b.size);
            p.key("stream");
            p.integer(0);
            p.key("segment_type");
            p.str(b.size > (int64_t(1) << 20) ? "large" : "small");
            p.key("segment_pool_id");
            p.integer(0);
            p.integer(0);
            p.tuple2();
            p.key("is_expandable");
            p.boolean(false);
            p.key("frames");
            write_frames(p, b);
            p.key("blocks");
            p.begin_list();
            p.begin_dict();
            p.key("address");
            p.integer(int64_t(b.addr));
            p.key("size");
            p.integer(b.size);
            p.key("requested_size");
            p.integer(b.size);
            p.key("state");
            p.str("active_allocated");
            p.key("frames");
            write_frames(p, b);
            p.end_dict();
            p.end_list();
            p.end_dict();
            ++entries;
        }
    }
    p.end_list();

    p.key("kvlab_devices");
    p.begin_list();
    for (int dev : devices) p.str(trace::device_code_name(dev));
    p.end_list();
    p.end_dict();
    p.finish();
    return entries;
}

}  // namespace kv::storage
