// Helpers shared by the GGUF tests: a byte builder for hand-made (often malformed) files that
// does not use GgufWriter, a temporary directory, and an "expect kv::Error containing" check.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/core/error.h"

namespace kv::gguf_test {

// Little-endian byte builder, independent of GgufWriter.
struct Bytes {
    std::vector<uint8_t> b;
    Bytes& raw(const std::string& s) {
        b.insert(b.end(), s.begin(), s.end());
        return *this;
    }
    Bytes& u8(uint8_t v) { return put(v); }
    Bytes& u32(uint32_t v) { return put(v); }
    Bytes& u64(uint64_t v) { return put(v); }
    Bytes& i64(int64_t v) { return put(v); }
    Bytes& f32(float v) { return put(v); }
    Bytes& str(const std::string& s) {
        u64(s.size());
        return raw(s);
    }
    Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
        raw("GGUF");
        u32(version);
        u64(n_tensors);
        return u64(n_kv);
    }
    // Tensor info: name, dims (ggml order), type id, offset.
    Bytes& tensor(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type, uint64_t offset) {
        str(name);
        u32(uint32_t(ne.size()));
        for (uint64_t n : ne) u64(n);
        u32(type);
        return u64(offset);
    }
    Bytes& pad(size_t align) {
        while (b.size() % align) b.push_back(0);
        return *this;
    }
    Bytes& zeros(size_t n) {
        b.insert(b.end(), n, uint8_t(0));
        return *this;
    }
    template <class T>
    Bytes& put(T v) {
        uint8_t tmp[sizeof(T)];
        std::memcpy(tmp, &v, sizeof(T));
        b.insert(b.end(), tmp, tmp + sizeof(T));
        return *this;
    }
};

// Runs `fn`, expecting a kv::Error whose message contains every string in `parts`.
template <class Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
    try {
        fn();
        ADD_FAILURE() << "expected kv::Error containing '" << (parts.empty() ? "" : parts[0]) << "', got no error";
    } catch (const Error& e) {
        std::string msg = e.what();
        for (const std::string& p : parts)
            EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
    }
}

// A fresh temporary directory, removed with its contents at scope exit.
struct TempDir {
    std::filesystem::path path;
    TempDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "kvlab_gguf_XXXXXX").string();
        if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
        path = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    std::string file(const std::string& name) const { return (path / name).string(); }
};

}  // namespace kv::gguf_test
