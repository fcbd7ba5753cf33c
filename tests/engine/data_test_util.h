// Helpers of the data tests (tests/engine/*_test.cpp for engine/data): a fresh folder per test,
// small files written by the tests, the message of a thrown kv::Error.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/data/dataset.h"

namespace kv::data_test {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A fresh folder per test, removed afterwards.
class TempDir {
   public:
    TempDir() {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        path_ = fs::path(::testing::TempDir()) / str("kvlab_data_", ::getpid(), "_", info->test_suite_name(), "_", info->name());
        fs::remove_all(path_);
        fs::create_directories(path_);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path_, ec);
    }
    std::string file(const std::string& name) const { return (path_ / name).string(); }
    const fs::path& path() const { return path_; }

   private:
    fs::path path_;
};

inline void write_text(const std::string& path, const std::string& text) {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
}

inline json read_json(const std::string& path) {
    std::ifstream in(path);
    return json::parse(in);
}

// "what\nHINT hint" of the kv::Error `f` throws; fails the test if it throws nothing.
inline std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return std::string(e.what()) + "\nHINT " + e.hint();
    }
    ADD_FAILURE() << "expected a kv::Error";
    return "";
}

// Ids of records, in order.
inline std::vector<std::string> ids_of(const std::vector<DataRecord>& recs) {
    std::vector<std::string> v;
    for (const auto& r : recs) v.push_back(r.id);
    return v;
}

}  // namespace kv::data_test
