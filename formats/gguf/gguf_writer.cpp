// Serialization for GgufWriter: the same layout gguf_parse.h reads, tensors packed in insertion
// order, each data block padded with zeros to the alignment.
#include "formats/gguf/gguf_writer.h"

#include <cstdio>
#include <cstring>

#include "engine/core/error.h"
#include "kernels/common/dtype.h"

namespace kv {

namespace {

struct Out {
    std::vector<uint8_t> b;
    template <class T>
    void put(T v) {
        uint8_t tmp[sizeof(T)];
        std::memcpy(tmp, &v, sizeof(T));
        for (uint8_t x : tmp) b.push_back(x);  // (resize + memcpy trips GCC 12's -Wstringop-overflow)
    }
    void put_string(const std::string& s) {
        put<uint64_t>(s.size());
        b.insert(b.end(), s.begin(), s.end());
    }
    void pad_to(uint64_t a) {
        while (b.size() % a) b.push_back(0);
    }
    // Value payload without its leading type tag (arrays carry their element type inside).
    void put_value(const GgufValue& v) {
        switch (v.type) {
            case GgufValueType::STRING: put_string(v.str); return;
            case GgufValueType::ARRAY:
                put<uint32_t>(uint32_t(v.elem));
                put<uint64_t>(v.count);
                if (v.elem == GgufValueType::STRING)
                    for (const std::string& s : v.strings) put_string(s);
                else if (v.elem == GgufValueType::ARRAY)
                    for (const GgufValue& a : v.arrays) put_value(a);
                else
                    b.insert(b.end(), v.raw.begin(), v.raw.end());
                return;
            default: b.insert(b.end(), v.raw.begin(), v.raw.end()); return;
        }
    }
};

}  // namespace

void GgufWriter::set(const std::string& key, GgufValue value) {
    for (auto& kv : metadata_)
        if (kv.first == key) {
            kv.second = std::move(value);
            return;
        }
    metadata_.emplace_back(key, std::move(value));
}

void GgufWriter::remove(const std::string& key) {
    for (size_t i = 0; i < metadata_.size(); ++i)
        if (metadata_[i].first == key) {
            metadata_.erase(metadata_.begin() + long(i));
            return;
        }
}

void GgufWriter::set_alignment(uint32_t alignment) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
        throw Error(str("GgufWriter: alignment ", alignment, " is not a power of two"));
    alignment_ = alignment;
    set("general.alignment", GgufValue::of_u32(alignment));
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne,
                            std::vector<uint8_t> bytes) {
    const GgmlTypeTraits& tr = ggml_type_info(type);
    int64_t numel = 1;
    for (int64_t n : ne) numel *= n;
    if (ne.empty() || ne[0] % tr.block_size != 0)
        throw Error(str("GgufWriter: tensor '", name, "' ne[0] is not a multiple of the ", tr.name, " block size ",
                        tr.block_size));
    const uint64_t want = uint64_t(numel / tr.block_size) * uint64_t(tr.type_size);
    if (bytes.size() != want)
        throw Error(str("GgufWriter: tensor '", name, "' of type ", tr.name, " needs ", want, " bytes, got ", bytes.size()));
    tensors_.push_back({name, type, ne, std::move(bytes)});
}

void GgufWriter::add_float_tensor(const std::string& name, const std::vector<int64_t>& torch_shape,
                                  const std::vector<float>& values, GgmlType type) {
    std::vector<int64_t> ne(torch_shape.rbegin(), torch_shape.rend());
    std::vector<uint8_t> bytes;
    Out o;
    for (float v : values) {
        if (type == GgmlType::F32)
            o.put<float>(v);
        else if (type == GgmlType::F16)
            o.put<uint16_t>(f32_to_f16(v));
        else if (type == GgmlType::BF16)
            o.put<uint16_t>(f32_to_bf16(v));
        else
            throw Error(str("GgufWriter: add_float_tensor stores F32, F16 or BF16, not ", ggml_type_name(type)));
    }
    add_tensor(name, type, ne, std::move(o.b));
}

std::vector<uint8_t> GgufWriter::bytes() const {
    Out o;
    o.put<uint32_t>(0x46554747u);  // the bytes 'G' 'G' 'U' 'F' in little-endian order
    o.put<uint32_t>(version);
    o.put<uint64_t>(tensors_.size());
    o.put<uint64_t>(metadata_.size());
    for (const auto& [key, v] : metadata_) {
        o.put_string(key);
        o.put<uint32_t>(uint32_t(v.type));
        o.put_value(v);
    }
    uint64_t offset = 0;
    for (const TensorEntry& t : tensors_) {
        o.put_string(t.name);
        o.put<uint32_t>(uint32_t(t.ne.size()));
        for (int64_t n : t.ne) o.put<uint64_t>(uint64_t(n));
        o.put<uint32_t>(uint32_t(t.type));
        o.put<uint64_t>(offset);
        offset += (t.data.size() + alignment_ - 1) / alignment_ * alignment_;
    }
    o.pad_to(alignment_);
    for (const TensorEntry& t : tensors_) {
        o.b.insert(o.b.end(), t.data.begin(), t.data.end());
        o.pad_to(alignment_);
    }
    return o.b;
}

void GgufWriter::write(const std::string& path) const {
    std::vector<uint8_t> b = bytes();
    std::FILE* fp = std::fopen(path.c_str(), "wb");
    if (!fp) throw Error(str(path, ": cannot create GGUF file"));
    const bool ok = std::fwrite(b.data(), 1, b.size(), fp) == b.size();
    if (std::fclose(fp) != 0 || !ok) throw Error(str(path, ": writing ", b.size(), " bytes failed"));
}

}  // namespace kv
