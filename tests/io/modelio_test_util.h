// Helpers for the model I/O tests: a per-test temporary folder, raw file bytes, hand-built
// safetensors files (independent of our writer), and error-message assertions.
// Test-only; nothing here may be used by engine code.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/model_config.h"

namespace kv::test {

// A fresh folder under the system temp dir, removed (recursively) on destruction.
class TempDir {
   public:
    TempDir();
    ~TempDir();
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::string& path() const { return path_; }
    std::string file(const std::string& name) const { return path_ + "/" + name; }

   private:
    std::string path_;
};

void write_bytes(const std::string& path, const std::string& bytes);
std::string read_bytes(const std::string& path);
std::vector<std::string> list_dir(const std::string& dir);  // sorted file names

// 8-byte little-endian length + header + data: a safetensors file built by hand.
std::string st_bytes(const std::string& header, const std::string& data);
std::string le_u64(uint64_t v);

// Runs f; returns the kv::Error message, "<no error>" or "<other exception: ...>".
template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    } catch (const std::exception& e) {
        return std::string("<other exception: ") + e.what() + ">";
    }
    return "<no error>";
}

// Every needle occurs in msg.
::testing::AssertionResult contains_all(const std::string& msg, std::initializer_list<const char*> needles);

// A small config of the given architecture (vocab 48, hidden 32, 2 layers, 4 heads, 2 kv heads).
ModelConfig tiny_config(Arch arch);

// Random weights with exactly the names and shapes of expected_weight_shapes(cfg).
TensorMap tiny_weights(const ModelConfig& cfg, DType dtype, uint64_t seed);

}  // namespace kv::test
