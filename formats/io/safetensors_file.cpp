// Memory-mapped safetensors loading (see safetensors_file.h).
// The mapping is MAP_PRIVATE with write permission: the file is never modified, but code that
// updates a weight in place (full fine-tuning) gets a private copy of the page instead of a
// segmentation fault. Truncating the file while it is mapped still raises SIGBUS on access;
// our own writer replaces files by rename, so it never does that.
#include "formats/io/safetensors_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>

#include "engine/core/error.h"
#include "formats/io/safetensors_parse.h"

namespace kv {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; big-endian hosts need byte swaps");

namespace {

struct FileMapping {
    void* addr = nullptr;
    size_t bytes = 0;
    ~FileMapping() {
        if (addr) ::munmap(addr, bytes);
    }
};

std::shared_ptr<FileMapping> map_file(const std::string& path, size_t& size_out) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(str(path, ": cannot open safetensors file: ", std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        throw Error(str(path, ": cannot open safetensors file: not a regular file"));
    }
    size_out = size_t(st.st_size);
    auto m = std::make_shared<FileMapping>();
    if (size_out > 0) {  // mmap of 0 bytes fails; the parser reports the truncated file
        void* p = ::mmap(nullptr, size_out, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            ::close(fd);
            throw Error(str(path, ": cannot memory-map safetensors file (", size_out, " bytes): ", std::strerror(err)));
        }
        m->addr = p;
        m->bytes = size_out;
    }
    ::close(fd);  // the mapping keeps the file contents reachable
    return m;
}

}  // namespace

SafetensorsContents load_safetensors(const std::string& path) {
    size_t size = 0;
    std::shared_ptr<FileMapping> mapping = map_file(path, size);
    static const uint8_t kEmpty[8] = {};
    const uint8_t* base = mapping->addr ? static_cast<const uint8_t*>(mapping->addr) : kEmpty;
    SafetensorsHeader h = parse_safetensors_header(base, size, path);

    SafetensorsContents out;
    out.has_metadata = h.has_metadata;
    out.metadata = std::move(h.metadata);
    for (const SafetensorsEntry& e : h.entries) {
        auto dtype = st_dtype_to_kv(e.dtype);
        if (!dtype)
            throw Error(str(path, ": tensor '", e.name, "' has dtype ", st_dtype_name(e.dtype),
                            ", which kvlab cannot hold; supported dtypes: ", st_loadable_dtypes()));
        if (int(e.shape.size()) > KV_MAX_DIMS)
            throw Error(str(path, ": tensor '", e.name, "' has rank ", e.shape.size(), " (shape ", shape_json(e.shape),
                            "); kvlab tensors have at most ", KV_MAX_DIMS, " dimensions"));
        // kv::Tensor strides are products of max(dim, 1); a zero-size tensor may still have
        // dimensions whose product overflows int64 (the parser only bounds the element count).
        int64_t span = 1;
        for (int64_t d : e.shape)
            if (__builtin_mul_overflow(span, std::max<int64_t>(d, 1), &span))
                throw Error(str(path, ": tensor '", e.name, "' has shape ", shape_json(e.shape),
                                ", whose dimensions multiply beyond 64 bits; kvlab cannot index it"));
        Shape shape(e.shape);
        TensorOptions opt;
        opt.category = MemCategory::WEIGHTS;
        opt.label = e.name;
        // The parser rejected files under 8 bytes, so the mapping exists here.
        uint8_t* p = static_cast<uint8_t*>(mapping->addr) + h.data_offset + e.begin;
        if (reinterpret_cast<uintptr_t>(p) % uintptr_t(dtype_size(*dtype)) != 0) {
            // Files from the reference writer are always aligned (8-byte data start, wider dtypes
            // first). Others may not be; kernels assume natural alignment, so copy those.
            Tensor t = Tensor::empty(shape, *dtype, opt);
            if (e.nbytes()) std::memcpy(t.data_ptr(), p, size_t(e.nbytes()));
            out.tensors[e.name] = std::move(t);
        } else {
            out.tensors[e.name] = Tensor::from_external(p, shape, *dtype, mapping, opt);
        }
    }
    return out;
}

}  // namespace kv
