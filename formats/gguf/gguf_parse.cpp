// GGUF container parser over a byte buffer. Every read goes through Cursor::need, which checks
// the remaining length before touching memory, and every count is checked against both the
// limits and the bytes left before anything is reserved, so hostile headers cannot make it
// allocate more than a small multiple of the file size.
#include "formats/gguf/gguf_parse.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <ostream>

#include "engine/core/error.h"

namespace kv {

// ---- GgufTensorInfo / GgufFile helpers ---------------------------------------------------
std::vector<int64_t> GgufTensorInfo::torch_shape() const {
    std::vector<int64_t> s;
    for (int i = n_dims - 1; i >= 0; --i) s.push_back(ne[i]);
    return s;
}

std::string GgufTensorInfo::shape_str() const {
    std::string s = "ne=[";
    for (int i = 0; i < n_dims; ++i) s += str(i ? ", " : "", ne[i]);
    return s + "]";
}

const GgufValue* GgufFile::find(const std::string& key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &metadata[it->second].second;
}

const GgufValue& GgufFile::get(const std::string& key) const {
    const GgufValue* v = find(key);
    if (!v) throw Error(str(source, ": metadata key '", key, "' is missing"));
    return *v;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors[it->second];
}

std::string GgufFile::what(const std::string& key) const { return str(source, ": metadata key '", key, "'"); }

void GgufFile::build_index() {
    kv_index_.clear();
    tensor_index_.clear();
    for (size_t i = 0; i < metadata.size(); ++i) kv_index_.emplace(metadata[i].first, i);
    for (size_t i = 0; i < tensors.size(); ++i) tensor_index_.emplace(tensors[i].name, i);
}

namespace {

// What is being read, for messages: "metadata key 'k' element 7 length". Built only when an
// error is thrown, so reading 50k vocabulary strings costs no string formatting.
struct Where {
    const std::string& what;
    int64_t elem = -1;
    const char* suffix = "";
};
std::ostream& operator<<(std::ostream& os, const Where& w) {
    os << w.what;
    if (w.elem >= 0) os << " element " << w.elem;
    return os << w.suffix;
}

// Bounds-checked little-endian reader over the buffer.
struct Cursor {
    const uint8_t* data;
    size_t size;
    size_t pos = 0;
    const std::string& src;

    size_t remaining() const { return size - pos; }

    void need(uint64_t n, const Where& w) const {
        if (n > remaining())
            throw Error(str(src, ": truncated file: ", w, " at byte ", pos, " needs ", n, " bytes but only ", remaining(),
                            " remain"));
    }
    void need(uint64_t n, const std::string& what) const { need(n, Where{what}); }
    template <class T>
    T read(const Where& w) {
        need(sizeof(T), w);
        T v;
        std::memcpy(&v, data + pos, sizeof(T));
        pos += sizeof(T);
        return v;
    }
    template <class T>
    T read(const std::string& what) {
        return read<T>(Where{what});
    }
    std::string read_string(const Where& w, uint64_t max_len) {
        uint64_t n = read<uint64_t>(Where{w.what, w.elem, " length"});
        if (n > max_len) throw Error(str(src, ": ", w, " is ", n, " bytes long, expected at most ", max_len));
        need(n, w);
        std::string s(reinterpret_cast<const char*>(data + pos), size_t(n));
        pos += size_t(n);
        return s;
    }
    std::string read_string(const std::string& what, uint64_t max_len) { return read_string(Where{what}, max_len); }
};

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }  // caller keeps x + a small

struct Parser {
    Cursor c;
    const GgufParseLimits& lim;

    GgufValue read_value(GgufValueType type, int depth, const std::string& what) {
        GgufValue v;
        v.type = type;
        if (type == GgufValueType::STRING) {
            v.str = c.read_string(what, lim.max_string_bytes);
        } else if (type == GgufValueType::ARRAY) {
            if (depth >= lim.max_array_depth)
                throw Error(str(c.src, ": ", what, " nests arrays deeper than ", lim.max_array_depth, " levels"));
            uint32_t et = c.read<uint32_t>(what + " element type");
            if (et >= uint32_t(GgufValueType::COUNT))
                throw Error(str(c.src, ": ", what, " is an array of unknown value type ", et,
                                ", expected 0..12 (uint8 ... float64)"));
            v.elem = GgufValueType(et);
            v.count = c.read<uint64_t>(what + " element count");
            if (v.count > lim.max_array_elements)
                throw Error(str(c.src, ": ", what, " has ", v.count, " elements, expected at most ",
                                lim.max_array_elements));
            size_t esz = gguf_value_type_size(v.elem);
            if (esz) {
                c.need(v.count * esz, str(what, " (", v.count, " × ", gguf_value_type_name(v.elem), ")"));
                v.raw.assign(c.data + c.pos, c.data + c.pos + v.count * esz);
                c.pos += size_t(v.count * esz);
                if (v.elem == GgufValueType::BOOL)
                    for (uint64_t k = 0; k < v.count; ++k)
                        if (v.raw[k] > 1)
                            throw Error(str(c.src, ": ", what, " element ", k, " is bool byte ", int(v.raw[k]),
                                            ", expected 0 or 1"));
            } else if (v.elem == GgufValueType::STRING) {
                c.need(v.count * 8, str(what, " (", v.count, " strings)"));  // each has a u64 length
                v.strings.reserve(size_t(v.count));
                for (uint64_t k = 0; k < v.count; ++k)
                    v.strings.push_back(c.read_string(Where{what, int64_t(k)}, lim.max_string_bytes));
            } else {
                c.need(v.count * 12, str(what, " (", v.count, " arrays)"));  // each has type + count
                v.arrays.reserve(size_t(v.count));
                for (uint64_t k = 0; k < v.count; ++k)
                    v.arrays.push_back(read_value(GgufValueType::ARRAY, depth + 1, str(what, " element ", k)));
            }
        } else {
            size_t esz = gguf_value_type_size(type);
            c.need(esz, what);
            v.raw.assign(c.data + c.pos, c.data + c.pos + esz);
            c.pos += esz;
            if (type == GgufValueType::BOOL && v.raw[0] > 1)
                throw Error(str(c.src, ": ", what, " is bool byte ", int(v.raw[0]), ", expected 0 or 1"));
        }
        return v;
    }

    void read_header(GgufFile& f, uint64_t& n_tensors, uint64_t& n_kv) {
        if (c.size < 4 || std::memcmp(c.data, "GGUF", 4) != 0) {
            std::string got;
            for (size_t i = 0; i < std::min<size_t>(c.size, 4); ++i) {
                char ch = char(c.data[i]);
                got += (ch >= 32 && ch < 127) ? std::string(1, ch) : str("\\x", "0123456789abcdef"[c.data[i] >> 4],
                                                                       "0123456789abcdef"[c.data[i] & 15]);
            }
            throw Error(str(c.src, ": not a GGUF file: bad magic '", got, "' (", c.size,
                            " bytes), expected the 4 bytes 'GGUF'"));
        }
        c.pos = 4;
        f.version = c.read<uint32_t>("version");
        if (f.version != 2 && f.version != 3) {
            if (f.version == 1)
                throw Error(str(c.src, ": GGUF version 1 (32-bit lengths) is not supported, expected version 2 or 3"));
            if ((f.version & 0xffff) == 0 && (f.version >> 16) != 0)
                throw Error(str(c.src, ": unsupported GGUF version ", f.version,
                                " (a big-endian file?), expected version 2 or 3 in little-endian byte order"));
            throw Error(str(c.src, ": unsupported GGUF version ", f.version, ", expected 2 or 3"));
        }
        n_tensors = c.read<uint64_t>("tensor count");
        n_kv = c.read<uint64_t>("metadata key/value count");
        // Smallest encodings: a kv is 8 (key length) + 1 + 4 (type) + 1 bytes; a tensor info is
        // 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes.
        if (n_kv > lim.max_kv || n_kv > c.remaining() / 14)
            throw Error(str(c.src, ": metadata key/value count ", n_kv, " is impossible for a file of ", c.size,
                            " bytes (limit ", lim.max_kv, ")"));
        if (n_tensors > lim.max_tensors || n_tensors > c.remaining() / 24)
            throw Error(str(c.src, ": tensor count ", n_tensors, " is impossible for a file of ", c.size,
                            " bytes (limit ", lim.max_tensors, ")"));
    }

    void read_metadata(GgufFile& f, uint64_t n_kv) {
        f.metadata.reserve(size_t(n_kv));
        std::unordered_map<std::string, size_t> seen;
        for (uint64_t i = 0; i < n_kv; ++i) {
            std::string key = c.read_string(str("metadata key ", i), lim.max_key_bytes);
            if (key.empty()) throw Error(str(c.src, ": metadata key ", i, " is empty, expected a name like 'general.name'"));
            if (!seen.emplace(key, i).second)
                throw Error(str(c.src, ": metadata key '", key, "' appears twice (entries ", seen[key], " and ", i,
                                "), expected unique keys"));
            std::string what = str("metadata key '", key, "'");
            uint32_t t = c.read<uint32_t>(what + " value type");
            if (t >= uint32_t(GgufValueType::COUNT))
                throw Error(str(c.src, ": ", what, " has unknown value type ", t, ", expected 0..12 (uint8 ... float64)"));
            f.metadata.emplace_back(std::move(key), read_value(GgufValueType(t), 0, what));
        }
    }

    void read_alignment(GgufFile& f) {
        for (const auto& [key, v] : f.metadata) {
            if (key != "general.alignment") continue;
            if (!gguf_value_type_is_integer(v.type))
                throw Error(str(c.src, ": metadata key 'general.alignment' is ", v.describe(),
                                ", expected a uint32 power of two"));
            // uint64 values above INT64_MAX decode negative here and are rejected with the rest.
            int64_t a = gguf_decode_int(v.type, v.raw.data(), 0);
            if (a <= 0 || uint64_t(a) > lim.max_alignment || (a & (a - 1)) != 0)
                throw Error(str(c.src, ": general.alignment is ", v.describe(), ", expected a power of two in [1, ",
                                lim.max_alignment, "]"));
            f.alignment = uint64_t(a);
        }
    }

    void read_tensor_infos(GgufFile& f, uint64_t n_tensors) {
        f.tensors.reserve(size_t(n_tensors));
        std::unordered_map<std::string, size_t> seen;
        for (uint64_t i = 0; i < n_tensors; ++i) {
            GgufTensorInfo t;
            t.name = c.read_string(str("name of tensor ", i), lim.max_tensor_name_bytes);
            if (!seen.emplace(t.name, i).second)
                throw Error(str(c.src, ": tensor name '", t.name, "' appears twice (tensors ", seen[t.name], " and ", i,
                                "), expected unique names"));
            std::string what = str("tensor '", t.name, "'");
            uint32_t nd = c.read<uint32_t>(what + " n_dims");
            if (nd > uint32_t(kGgufMaxDims))
                throw Error(str(c.src, ": ", what, " has ", nd, " dimensions, expected at most ", kGgufMaxDims));
            t.n_dims = int(nd);
            // numel must stay representable (and small enough that block arithmetic cannot overflow).
            const uint64_t max_numel = uint64_t(1) << 62;
            uint64_t numel = 1;
            for (int d = 0; d < t.n_dims; ++d) {
                uint64_t n = c.read<uint64_t>(str(what, " ne[", d, "]"));
                if (n > max_numel)
                    throw Error(str(c.src, ": ", what, " ne[", d, "] = ", n, " is out of range, expected < 2^62"));
                t.ne[d] = int64_t(n);
                if (n != 0 && numel > max_numel / n)
                    throw Error(str(c.src, ": ", what, " with ", t.shape_str(), "... has more than 2^62 elements"));
                numel *= n;
            }
            uint32_t tid = c.read<uint32_t>(what + " type");
            const GgmlTypeTraits* tr = ggml_type_traits(tid);
            if (!tr)
                throw Error(str(c.src, ": ", what, " has unknown ggml type id ", tid,
                                ", expected a known type (0-3, 6-30, 34, 35, 39-42)"));
            t.type = tr->type;
            if (t.ne[0] % tr->block_size != 0)
                throw Error(str(c.src, ": ", what, " of type ", tr->name, " has ", t.shape_str(), ": ne[0] = ", t.ne[0],
                                " elements per row is not a multiple of the block size ", tr->block_size));
            uint64_t blocks = numel / uint64_t(tr->block_size);
            if (blocks > std::numeric_limits<uint64_t>::max() / 4 / uint64_t(tr->type_size))
                throw Error(str(c.src, ": ", what, " with ", t.shape_str(), " is too large in bytes"));
            t.nbytes = blocks * uint64_t(tr->type_size);
            t.offset = c.read<uint64_t>(what + " data offset");
            if (t.offset % f.alignment != 0)
                throw Error(str(c.src, ": ", what, " data offset ", t.offset, " is not a multiple of the alignment ",
                                f.alignment));
            f.tensors.push_back(std::move(t));
        }
    }

    void place_data(GgufFile& f) {
        f.data_offset = align_up(c.pos, f.alignment);  // pos <= size and alignment <= 2^20: no overflow
        if (f.tensors.empty()) return;
        if (f.data_offset > c.size)
            throw Error(str(c.src, ": truncated file: the data section starts at byte ", f.data_offset,
                            " (aligned to ", f.alignment, ") but the file has ", c.size, " bytes"));
        const uint64_t data_bytes = c.size - f.data_offset;
        for (GgufTensorInfo& t : f.tensors) {
            if (t.offset > data_bytes || t.nbytes > data_bytes - t.offset)
                throw Error(str(c.src, ": tensor '", t.name, "' data (", t.nbytes, " bytes at offset ", t.offset,
                                " of the data section, which starts at byte ", f.data_offset,
                                ") extends past the end of the file (", data_bytes, " data bytes); truncated file?"));
            t.file_offset = f.data_offset + t.offset;
        }
        std::vector<const GgufTensorInfo*> order;
        for (const GgufTensorInfo& t : f.tensors) order.push_back(&t);
        std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
        for (size_t i = 1; i < order.size(); ++i) {
            const GgufTensorInfo* a = order[i - 1];
            const GgufTensorInfo* b = order[i];
            if (a->nbytes > 0 && b->nbytes > 0 && a->offset + a->nbytes > b->offset)
                throw Error(str(c.src, ": tensors '", a->name, "' [", a->offset, ", ", a->offset + a->nbytes, ") and '",
                                b->name, "' [", b->offset, ", ", b->offset + b->nbytes,
                                ") overlap in the data section, expected disjoint ranges"));
        }
        // The tensors must tile the data section: each starts where the previous one ends
        // (rounded up to the alignment). A gap means a type or shape that disagrees with the
        // bytes written (e.g. Q4_1 relabelled Q4_0): its data would be read from the wrong place.
        uint64_t expect = 0;
        for (const GgufTensorInfo* t : order) {
            if (t->offset != expect)
                throw Error(str(c.src, ": tensor '", t->name, "' (", ggml_type_name(t->type), ", ", t->shape_str(),
                                ") starts at offset ", t->offset, " of the data section but the tensors before it end at ",
                                expect, ": a ", t->offset > expect ? "gap" : "misplacement", " of ",
                                t->offset > expect ? t->offset - expect : expect - t->offset,
                                " bytes; expected tensors to tile the data section (a tensor's type or shape "
                                "disagrees with its data?)"));
            expect = align_up(t->offset + t->nbytes, f.alignment);
        }
        const uint64_t last_end = order.back()->offset + order.back()->nbytes;
        if (data_bytes > expect)
            throw Error(str(c.src, ": ", data_bytes - last_end, " bytes follow the last tensor '", order.back()->name,
                            "' in the data section (it ends at ", last_end, " of ", data_bytes,
                            "); expected the tensors to tile the data section (a tensor's type or shape disagrees "
                            "with its data?)"));
    }
};

}  // namespace

GgufFile gguf_parse(const uint8_t* data, size_t size, const std::string& source, const GgufParseLimits& limits) {
    static const uint8_t empty = 0;
    Parser p{Cursor{data ? data : &empty, data ? size : 0, 0, source}, limits};
    GgufFile f;
    f.source = source;
    f.file_size = size;
    uint64_t n_tensors = 0, n_kv = 0;
    p.read_header(f, n_tensors, n_kv);
    p.read_metadata(f, n_kv);
    p.read_alignment(f);
    p.read_tensor_infos(f, n_tensors);
    p.place_data(f);
    f.build_index();
    return f;
}

}  // namespace kv
