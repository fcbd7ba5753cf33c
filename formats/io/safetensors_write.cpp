// Safetensors writer (see safetensors_write.h). The header text is built by hand rather than
// through a json object so the key order matches the reference writer byte for byte.
#include "formats/io/safetensors_write.h"

#include <algorithm>

#include "engine/core/error.h"
#include "formats/io/file_util.h"
#include "formats/io/json_strict.h"

namespace kv {

namespace {
std::string json_string(const std::string& s, const std::string& what) {
    try {
        return nlohmann::json(s).dump();
    } catch (const std::exception&) {
        throw Error(str("safetensors: ", what, " is not valid UTF-8"));
    }
}
}  // namespace

std::string safetensors_header_json(const std::vector<SafetensorsEntry>& entries,
                                    const std::optional<SafetensorsMetadata>& metadata) {
    std::string h = "{";
    bool first = true;
    if (metadata) {
        h += "\"__metadata__\":{";
        bool first_kv = true;
        for (const auto& [k, v] : *metadata) {  // std::map: keys in byte order
            h += first_kv ? "" : ",";
            h += json_string(k, str("metadata key '", k, "'")) + ":" + json_string(v, str("metadata value for '", k, "'"));
            first_kv = false;
        }
        h += "}";
        first = false;
    }
    for (const auto& e : entries) {
        if (e.name == "__metadata__") throw Error("safetensors: '__metadata__' is reserved and cannot name a tensor");
        h += first ? "" : ",";
        first = false;
        h += json_string(e.name, str("tensor name '", e.name, "'"));
        h += str(":{\"dtype\":\"", st_dtype_name(e.dtype), "\",\"shape\":[");
        for (size_t i = 0; i < e.shape.size(); ++i) h += str(i ? "," : "", e.shape[i]);
        h += str("],\"data_offsets\":[", e.begin, ",", e.end, "]}");
    }
    h += "}";
    h.resize((h.size() + 7) / 8 * 8, ' ');
    if (h.size() > kSafetensorsMaxHeader)
        throw Error(str("safetensors: the header would be ", h.size(), " bytes; the format allows at most ", kSafetensorsMaxHeader));
    return h;
}

void write_safetensors(const std::string& path, const TensorMap& tensors, const std::optional<SafetensorsMetadata>& metadata) {
    struct Item {
        SafetensorsEntry entry;
        const Tensor* tensor;
    };
    std::vector<Item> items;
    items.reserve(tensors.size());
    for (const auto& [name, t] : tensors) {
        if (!t.defined()) throw Error(str(path, ": tensor '", name, "' is undefined; nothing to write"));
        Item it{{}, &t};
        it.entry.name = name;
        it.entry.dtype = st_dtype_from_kv(t.dtype());
        it.entry.shape = t.shape().vec();
        items.push_back(std::move(it));
    }
    // The reference writer's order: dtype descending in its enum order (wider first), then name.
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
        if (a.entry.dtype != b.entry.dtype) return a.entry.dtype > b.entry.dtype;
        return a.entry.name < b.entry.name;
    });
    uint64_t offset = 0;
    for (auto& it : items) {
        it.entry.begin = offset;
        offset += uint64_t(it.tensor->nbytes());
        it.entry.end = offset;
    }
    std::vector<SafetensorsEntry> entries;
    entries.reserve(items.size());
    for (const auto& it : items) entries.push_back(it.entry);
    std::string header;
    try {
        header = safetensors_header_json(entries, metadata);
    } catch (const Error& e) {
        throw Error(str(path, ": ", e.what()));
    }

    AtomicFileWriter w(path);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(header.size()) >> (8 * i));
    w.write(len, 8);
    w.write(header.data(), header.size());
    for (const auto& it : items) {
        if (it.tensor->numel() == 0) continue;
        // One tensor at a time: host copy only for device or strided tensors.
        Tensor host = it.tensor->device().is_cpu() ? *it.tensor : it.tensor->to(Device{});
        host = host.contiguous();
        w.write(host.data_ptr(), host.nbytes());
    }
    w.commit();
}

}  // namespace kv
