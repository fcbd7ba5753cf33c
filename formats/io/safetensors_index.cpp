// Sharded safetensors index parsing and loading (see safetensors_index.h).
#include "formats/io/safetensors_index.h"

#include "engine/core/error.h"
#include "formats/io/file_util.h"
#include "formats/io/json_strict.h"

namespace kv {

SafetensorsIndex parse_safetensors_index(const std::string& json_text, const std::string& source) {
    nlohmann::json root = parse_json_strict(json_text, source, "the safetensors index");
    if (!root.is_object()) throw Error(str(source, ": the index must be a JSON object, got ", json_describe(root)));
    SafetensorsIndex idx;
    JsonFields f(root, source);
    if (const nlohmann::json* m = f.find("metadata")) {
        if (!m->is_object()) f.fail("metadata", str("must be an object, got ", json_describe(*m)));
        for (auto it = m->begin(); it != m->end(); ++it)
            idx.metadata[it.key()] = it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
    }
    const nlohmann::json* wm = f.find("weight_map");
    if (!wm) f.fail("weight_map", "is missing; expected {\"tensor name\": \"shard file\", ...}");
    if (!wm->is_object()) f.fail("weight_map", str("must be an object of tensor name → shard file, got ", json_describe(*wm)));
    for (auto it = wm->begin(); it != wm->end(); ++it) {
        if (!it.value().is_string())
            throw Error(str(source, ": weight_map entry for '", it.key(), "' must be a shard file name, got ", json_describe(it.value())));
        std::string shard = it.value().get<std::string>();
        // Shards live beside the index; a path would let an index read arbitrary files.
        if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
            shard.find('\\') != std::string::npos)
            throw Error(str(source, ": weight_map entry for '", it.key(), "' names shard '", shard,
                            "'; expected a plain file name in the same folder"));
        idx.weight_map[it.key()] = std::move(shard);
    }
    return idx;
}

SafetensorsContents load_safetensors_sharded(const std::string& index_path) {
    SafetensorsIndex idx = parse_safetensors_index(read_text_file(index_path, "safetensors index"), index_path);
    size_t slash = index_path.find_last_of('/');
    std::string dir = slash == std::string::npos ? std::string() : index_path.substr(0, slash + 1);

    std::map<std::string, std::vector<std::string>> by_shard;  // shard → names mapped to it
    for (const auto& [name, shard] : idx.weight_map) by_shard[shard].push_back(name);

    SafetensorsContents out;
    out.has_metadata = true;
    out.metadata = idx.metadata;
    for (const auto& [shard, names] : by_shard) {
        std::string shard_path = dir + shard;
        if (!is_regular_file(shard_path))
            throw Error(str(index_path, ": shard '", shard, "' (mapped for '", names.front(), "'",
                            names.size() > 1 ? str(" and ", names.size() - 1, " more") : std::string(),
                            ") does not exist in the folder"));
        SafetensorsContents part = load_safetensors(shard_path);
        for (const auto& name : names)
            if (!part.tensors.count(name))
                throw Error(str(index_path, ": weight_map maps '", name, "' to shard '", shard,
                                "', but that shard does not contain it"));
        for (auto& [name, t] : part.tensors) {
            auto it = idx.weight_map.find(name);
            if (it == idx.weight_map.end())
                throw Error(str(index_path, ": shard '", shard, "' contains '", name, "', which weight_map does not list"));
            if (it->second != shard)
                throw Error(str(index_path, ": '", name, "' appears in shard '", shard, "' but weight_map maps it to '",
                                it->second, "'; each tensor must be stored exactly once"));
            out.tensors[name] = std::move(t);
        }
    }
    return out;
}

}  // namespace kv
