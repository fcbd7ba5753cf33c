// mmap + parse + per-tensor conversion. The mapping is MAP_PRIVATE | MAP_NORESERVE with write
// permission so zero-copy weights can be trained in place without touching the file or
// reserving swap for pages nobody writes; it is unmapped when the last tensor viewing it dies.
#include "formats/gguf/gguf_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/core/error.h"
#include "formats/gguf/gguf_dequant.h"

namespace kv {

namespace {

struct Mapping {
    void* addr = nullptr;
    size_t size = 0;
    ~Mapping() {
        if (addr) munmap(addr, size);
    }
};

}  // namespace

PackedFormat gguf_packed_format(GgmlType t) {
    switch (t) {
        case GgmlType::Q8_0: return PackedFormat::Q8_0;
        case GgmlType::Q4_0: return PackedFormat::Q4_0;
        case GgmlType::Q4_1: return PackedFormat::Q4_1;
        case GgmlType::Q5_0: return PackedFormat::Q5_0;
        case GgmlType::Q5_1: return PackedFormat::Q5_1;
        case GgmlType::Q4_K: return PackedFormat::Q4_K;
        case GgmlType::Q5_K: return PackedFormat::Q5_K;
        case GgmlType::Q6_K: return PackedFormat::Q6_K;
        case GgmlType::F16: return PackedFormat::F16;
        case GgmlType::BF16: return PackedFormat::BF16;
        default: return PackedFormat::NONE;
    }
}

GgufReader::GgufReader(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        throw Error(str(path, ": cannot open GGUF file: ", std::strerror(errno)),
                    "scripts/fetch_assets.sh downloads the SmolLM2 model into assets/cache/");
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        ::close(fd);
        throw Error(str(path, ": not a regular file (", std::strerror(e), "), expected a GGUF file"));
    }
    auto m = std::make_shared<Mapping>();
    m->size = size_t(st.st_size);
    if (m->size > 0) {
        void* a = mmap(nullptr, m->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
        if (a == MAP_FAILED) {
            int e = errno;
            ::close(fd);
            throw Error(str(path, ": cannot memory-map ", m->size, " bytes: ", std::strerror(e)));
        }
        m->addr = a;
    }
    ::close(fd);  // the mapping keeps the file referenced
    base_ = static_cast<const uint8_t*>(m->addr);
    mapping_ = m;
    file_ = gguf_parse(base_, m->size, path);
}

Tensor GgufReader::load(const std::string& name, DType dtype, bool zero_copy, const int64_t* row_map) const {
    const GgufTensorInfo* info = file_.find_tensor(name);
    if (!info) throw Error(str(file_.source, ": no tensor named '", name, "' (the file has ", file_.tensors.size(), ")"));
    return load(*info, dtype, zero_copy, row_map);
}

Tensor GgufReader::load(const GgufTensorInfo& info, DType dtype, bool zero_copy, const int64_t* row_map) const {
    GgufLoadJob job;
    job.info = &info;
    job.dtype = dtype;
    job.zero_copy = zero_copy;
    if (row_map) job.row_map.assign(row_map, row_map + info.n_rows());
    return load_batch({job}).front();
}

std::vector<Tensor> GgufReader::load_batch(const std::vector<GgufLoadJob>& jobs) const {
    struct Work {
        GgmlType type;
        const uint8_t* src;
        int64_t r0, r1, row_len;
        DType dtype;
        void* dst;
        const int64_t* row_map;
    };
    std::vector<Tensor> out(jobs.size());
    std::vector<Work> work;
    std::vector<std::pair<const uint8_t*, size_t>> release;  // source bytes to drop after the copy
    int64_t total = 0;  // elements to convert
    for (size_t j = 0; j < jobs.size(); ++j) {
        const GgufLoadJob& job = jobs[j];
        const GgufTensorInfo& info = *job.info;
        const std::string what = str(file_.source, ": tensor '", info.name, "'");
        if (job.dtype != DType::F32 && job.dtype != DType::BF16)
            throw Error(str(what, ": tensors load as f32 or bf16, not dtype ", int(job.dtype)));
        if (!gguf_can_dequantize(info.type))
            throw Error(str(what, " has ggml type ", ggml_type_name(info.type),
                            ", which kvlab cannot dequantize; supported: ", ggml_dequantizable_type_list()));
        const int64_t n_rows = info.n_rows();
        if (!job.row_map.empty()) {
            std::vector<bool> seen(static_cast<size_t>(n_rows), false);
            bool ok = int64_t(job.row_map.size()) == n_rows;
            for (size_t r = 0; ok && r < job.row_map.size(); ++r) {
                const int64_t d = job.row_map[r];
                ok = d >= 0 && d < n_rows && !seen[size_t(d)];
                if (ok) seen[size_t(d)] = true;
            }
            if (!ok) throw Error(str(what, ": row map is not a permutation of its ", n_rows, " rows"));
        }
        TensorOptions opt;
        opt.category = MemCategory::WEIGHTS;
        opt.label = info.name;
        const uint8_t* src = data(info);
        // A preallocated destination must be exactly what would have been allocated.
        auto take_dst = [&](const Shape& shape, DType dt) {
            if (!job.dst.defined()) return Tensor::empty(shape, dt, opt);
            if (job.dst.shape() != shape || job.dst.dtype() != dt || !job.dst.is_contiguous() ||
                job.dst.device().type != DeviceType::CPU)
                throw Error(str(what, ": destination ", job.dst.describe(), " does not match dtype ", int(dt), " ", shape.str(),
                                " (contiguous, on the CPU)"));
            return job.dst;
        };
        if (job.packed) {
            const PackedFormat pf = gguf_packed_format(info.type);
            if (pf == PackedFormat::NONE)
                throw Error(str(what, " has ggml type ", ggml_type_name(info.type), ", which kvlab cannot keep packed"));
            const int64_t be = packed_block_elems(pf), bb = packed_block_bytes(pf);
            if (info.ne[0] % be != 0)
                throw Error(str(what, ": rows of ", info.ne[0], " elements are not whole blocks of ", be));
            const int64_t row_bytes = info.ne[0] / be * bb;
            out[j] = take_dst(Shape{n_rows, info.ne[0] / be, bb}, DType::U8);
            uint8_t* dst = out[j].data<uint8_t>();
            for (int64_t r = 0; r < n_rows; ++r)
                std::memcpy(dst + size_t(job.row_map.empty() ? r : job.row_map[size_t(r)]) * size_t(row_bytes),
                            src + size_t(r) * size_t(row_bytes), size_t(row_bytes));
            if (job.release_source) release.emplace_back(src, size_t(info.nbytes));
            continue;
        }
        Shape shape(info.torch_shape());
        const bool same = (info.type == GgmlType::F32 && job.dtype == DType::F32) ||
                          (info.type == GgmlType::BF16 && job.dtype == DType::BF16);
        const bool aligned = reinterpret_cast<uintptr_t>(src) % uintptr_t(dtype_size(job.dtype)) == 0;
        if (same && job.zero_copy && aligned && job.row_map.empty() && !job.dst.defined()) {
            out[j] = Tensor::from_external(const_cast<uint8_t*>(src), shape, job.dtype, mapping_, opt);
            continue;
        }
        gguf_check_dequantizable(info.type, info.ne[0], job.dtype, what);
        out[j] = take_dst(shape, job.dtype);
        total += info.numel();
        const int64_t row_len = info.ne[0];
        const int64_t chunk = row_len > 0 ? std::max<int64_t>(1, (int64_t(1) << 16) / row_len) : n_rows;
        for (int64_t r = 0; r < n_rows; r += chunk)
            work.push_back({info.type, src, r, std::min(n_rows, r + chunk), row_len, job.dtype, out[j].data_ptr(),
                            job.row_map.empty() ? nullptr : job.row_map.data()});
        if (job.release_source) release.emplace_back(src, size_t(info.nbytes));
    }
    // Dynamic scheduling: chunks are ~64K elements, and a busy core just takes fewer of them.
    // Small batches stay on this thread (see gguf_dequantize_rows).
#pragma omp parallel for schedule(dynamic, 1) if (work.size() > 1 && total >= (int64_t(1) << 22))
    for (size_t w = 0; w < work.size(); ++w) {
        const Work& k = work[w];
        gguf_dequantize_row_range(k.type, k.src, k.r0, k.r1, k.row_len, k.dtype, k.dst, k.row_map);
    }
    // Whole pages inside a copied tensor's bytes only: a page shared with a neighbouring
    // (possibly zero-copy) tensor stays. Advice only, so a failure changes nothing but RSS.
    const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
    for (const auto& [p, n] : release) {
        const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
        const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
        if (b > a) madvise(reinterpret_cast<void*>(a), size_t(b - a), MADV_DONTNEED);
    }
    return out;
}

}  // namespace kv
