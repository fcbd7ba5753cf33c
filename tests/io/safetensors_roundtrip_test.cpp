// Safetensors write → read: exact bytes for every dtype, the file layout against hand-built
// and reference-writer bytes, non-contiguous input, metadata, atomic replacement, alignment
// and memory accounting of mapped tensors.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "formats/io/safetensors_file.h"
#include "formats/io/safetensors_write.h"
#include "engine/memory/memory_tracker.h"
#include "modelio_test_util.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

using test::contains_all;
using test::error_of;
using test::st_bytes;

// A tensor whose bytes are random (all bit patterns, NaNs included: the file must keep them).
Tensor random_bytes_tensor(const Shape& shape, DType dtype, std::mt19937_64& rng, const std::string& label) {
    Tensor t = Tensor::empty(shape, dtype, TensorOptions{Device{}, MemCategory::WEIGHTS, label});
    auto* p = static_cast<uint8_t*>(t.data_ptr());
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] = uint8_t(rng());
    return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
    if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
    Tensor ca = a.contiguous(), cb = b.contiguous();
    return ca.nbytes() == cb.nbytes() && (ca.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0);
}

std::string f32_bytes(std::initializer_list<float> v) {
    std::string s;
    for (float f : v) {
        char b[4];
        std::memcpy(b, &f, 4);
        s.append(b, 4);
    }
    return s;
}

const DType kAllDTypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U8};

TEST(SafetensorsRoundTrip, EveryDtypeKeepsExactBytes) {
    test::TempDir dir;
    std::mt19937_64 rng(test::seed_for("EveryDtypeKeepsExactBytes"));
    TensorMap all;
    for (DType dt : kAllDTypes) {
        std::string name = std::string("t.") + st_dtype_name(st_dtype_from_kv(dt));
        Tensor t = random_bytes_tensor({3, 5, 2}, dt, rng, name);
        all[name] = t;
        // One file per dtype, then all of them together (mixed order and alignment).
        std::string path = dir.file(name + ".safetensors");
        write_safetensors(path, {{name, t}});
        SafetensorsContents back = load_safetensors(path);
        ASSERT_EQ(back.tensors.size(), 1u);
        const Tensor& r = back.tensors.at(name);
        EXPECT_EQ(r.dtype(), dt) << name;
        EXPECT_EQ(r.shape(), t.shape()) << name;
        EXPECT_TRUE(same_bytes(r, t)) << name;
    }
    write_safetensors(dir.file("all.safetensors"), all);
    SafetensorsContents back = load_safetensors(dir.file("all.safetensors"));
    ASSERT_EQ(back.tensors.size(), all.size());
    for (const auto& [name, t] : all) {
        const Tensor& r = back.tensors.at(name);
        EXPECT_TRUE(same_bytes(r, t)) << name;
        EXPECT_EQ(r.category(), MemCategory::WEIGHTS);
        EXPECT_EQ(r.storage()->label, name);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(r.data_ptr()) % uintptr_t(dtype_size(r.dtype())), 0u) << name;
    }
    EXPECT_TRUE(back.has_metadata);
    EXPECT_EQ(back.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
}

// Expected header spelled out by hand from the format rules: "__metadata__" first, entries by
// dtype (reference enum order, descending: I64 > F32 > BF16), then name; compact JSON; spaces
// up to a multiple of 8.
TEST(SafetensorsRoundTrip, WriterBytesMatchHandBuiltFile) {
    test::TempDir dir;
    TensorMap m;
    m["b"] = Tensor::from_f32({2}, {1.0f, 2.0f});
    m["d"] = Tensor::from_f32({2, 2}, {3.0f, 4.0f, 5.0f, 6.0f});
    m["a"] = Tensor::from_f32({3}, {1.0f, -2.0f, 0.5f}, DType::BF16);
    m["c"] = Tensor::from_i64({1}, {-7});
    write_safetensors(dir.file("x.safetensors"), m);

    std::string header =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"c\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
        "\"d\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[16,32]},"
        "\"a\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[32,38]}}";
    header.resize((header.size() + 7) / 8 * 8, ' ');
    std::string data = test::le_u64(uint64_t(-7)) + f32_bytes({1, 2}) + f32_bytes({3, 4, 5, 6}) +
                       std::string("\x80\x3f\x00\xc0\x00\x3f", 6);  // bf16 1.0, -2.0, 0.5
    std::string expected = st_bytes(header, data);
    std::string got = test::read_bytes(dir.file("x.safetensors"));
    EXPECT_EQ(got, expected);
    EXPECT_EQ((8 + header.size()) % 8, 0u);
}

// Outputs of the reference implementation for the same inputs (huggingface/safetensors'
// serialization tests): no metadata, a header that needs no padding, one that needs 7 spaces,
// and the empty file.
TEST(SafetensorsRoundTrip, WriterBytesMatchReferenceWriter) {
    test::TempDir dir;
    Tensor six = Tensor::from_f32({1, 2, 3}, {0, 1, 2, 3, 4, 5});
    write_safetensors(dir.file("a.safetensors"), {{"attn.0", six}}, std::nullopt);
    EXPECT_EQ(test::read_bytes(dir.file("a.safetensors")),
              st_bytes("{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}", f32_bytes({0, 1, 2, 3, 4, 5})));

    write_safetensors(dir.file("b.safetensors"), {{"attn0", six.reshape({1, 1, 2, 3})}}, std::nullopt);
    EXPECT_EQ(test::read_bytes(dir.file("b.safetensors")),
              st_bytes("{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}       ",
                       f32_bytes({0, 1, 2, 3, 4, 5})));

    write_safetensors(dir.file("c.safetensors"), {}, std::nullopt);
    EXPECT_EQ(test::read_bytes(dir.file("c.safetensors")), st_bytes("{}      ", ""));
    write_safetensors(dir.file("d.safetensors"), {}, SafetensorsMetadata{{"framework", "pt"}});
    EXPECT_EQ(test::read_bytes(dir.file("d.safetensors")), st_bytes("{\"__metadata__\":{\"framework\":\"pt\"}}     ", ""));
    EXPECT_EQ(load_safetensors(dir.file("d.safetensors")).metadata.at("framework"), "pt");
}

// Headers the reference reader accepts though our writer would pad them: unpadded JSON
// (N = 60) and a rank-0 tensor.
TEST(SafetensorsRoundTrip, ReadsUnpaddedAndScalarFiles) {
    test::TempDir dir;
    test::write_bytes(dir.file("a.safetensors"),
                      st_bytes("{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", std::string(16, '\0')));
    SafetensorsContents a = load_safetensors(dir.file("a.safetensors"));
    EXPECT_EQ(a.tensors.at("test").shape(), Shape({2, 2}));
    EXPECT_EQ(a.tensors.at("test").to_i64_vector(), (std::vector<int64_t>{0, 0, 0, 0}));
    EXPECT_FALSE(a.has_metadata);

    test::write_bytes(dir.file("b.safetensors"),
                      st_bytes("{\"test\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[0,4]}}", std::string("\x2a\0\0\0", 4)));
    SafetensorsContents b = load_safetensors(dir.file("b.safetensors"));
    EXPECT_EQ(b.tensors.at("test").ndim(), 0);
    EXPECT_EQ(b.tensors.at("test").item(), 42.0);
}

TEST(SafetensorsRoundTrip, NonContiguousTensorsAreWrittenContiguously) {
    test::TempDir dir;
    std::mt19937_64 rng(test::seed_for("NonContiguous"));
    Tensor base = test::random_tensor({4, 6}, DType::F32, rng);
    TensorMap m;
    m["transposed"] = base.transpose(0, 1);          // (6, 4), strides (1, 6)
    m["sliced"] = base.slice(1, 1, 5);                // (4, 4), row stride 6
    m["expanded"] = base.select(0, 2).unsqueeze(0).expand({3, 6});  // stride 0
    for (const auto& [name, t] : m) ASSERT_FALSE(t.is_contiguous()) << name;
    write_safetensors(dir.file("nc.safetensors"), m);
    SafetensorsContents back = load_safetensors(dir.file("nc.safetensors"));
    for (const auto& [name, t] : m) {
        EXPECT_EQ(back.tensors.at(name).shape(), t.shape()) << name;
        EXPECT_EQ(back.tensors.at(name).to_f32_vector(), t.contiguous().to_f32_vector()) << name;
    }
    // 24 + 16 + 18 floats, nothing else: the data section has no gaps or strides.
    std::string bytes = test::read_bytes(dir.file("nc.safetensors"));
    SafetensorsHeader h = parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "nc");
    EXPECT_EQ(h.data_size, (24u + 16u + 18u) * 4u);
}

TEST(SafetensorsRoundTrip, ZeroSizeAndScalarTensors) {
    test::TempDir dir;
    TensorMap m;
    m["empty"] = Tensor::zeros({0, 4}, DType::F32);
    m["scalar"] = Tensor::full({}, DType::F64, 2.5);
    m["also_empty"] = Tensor::zeros({3, 0}, DType::BF16);
    write_safetensors(dir.file("z.safetensors"), m);
    SafetensorsContents back = load_safetensors(dir.file("z.safetensors"));
    EXPECT_EQ(back.tensors.at("empty").shape(), Shape({0, 4}));
    EXPECT_EQ(back.tensors.at("also_empty").shape(), Shape({3, 0}));
    EXPECT_EQ(back.tensors.at("scalar").ndim(), 0);
    EXPECT_EQ(back.tensors.at("scalar").item(), 2.5);
}

TEST(SafetensorsRoundTrip, MetadataCanBeOmittedOrCustom) {
    test::TempDir dir;
    TensorMap m{{"w", Tensor::from_f32({1}, {1.0f})}};
    write_safetensors(dir.file("none.safetensors"), m, std::nullopt);
    EXPECT_EQ(test::read_bytes(dir.file("none.safetensors")).find("__metadata__"), std::string::npos);
    EXPECT_FALSE(load_safetensors(dir.file("none.safetensors")).has_metadata);

    SafetensorsMetadata md{{"format", "pt"}, {"lora_rank", "8"}, {"note", "quote \" and ünïcode"}};
    write_safetensors(dir.file("md.safetensors"), m, md);
    SafetensorsContents back = load_safetensors(dir.file("md.safetensors"));
    EXPECT_TRUE(back.has_metadata);
    EXPECT_EQ(back.metadata, md);
}

TEST(SafetensorsRoundTrip, ReplacingAMappedFileIsAtomic) {
    test::TempDir dir;
    std::string path = dir.file("w.safetensors");
    write_safetensors(path, {{"w", Tensor::from_f32({3}, {1, 2, 3})}});
    SafetensorsContents old = load_safetensors(path);
    write_safetensors(path, {{"w", Tensor::from_f32({3}, {7, 8, 9})}});
    // The old mapping still sees the old file (replaced by rename, never truncated).
    EXPECT_EQ(old.tensors.at("w").to_f32_vector(), (std::vector<float>{1, 2, 3}));
    EXPECT_EQ(load_safetensors(path).tensors.at("w").to_f32_vector(), (std::vector<float>{7, 8, 9}));
    EXPECT_EQ(test::list_dir(dir.path()), (std::vector<std::string>{"w.safetensors"}));  // no temp files left

    // A failed write leaves the existing file alone and no temp file behind.
    std::string msg = error_of([&] { write_safetensors(path, {{"__metadata__", Tensor::from_f32({1}, {0})}}); });
    EXPECT_TRUE(contains_all(msg, {"w.safetensors", "'__metadata__' is reserved"}));
    EXPECT_EQ(load_safetensors(path).tensors.at("w").to_f32_vector(), (std::vector<float>{7, 8, 9}));
    EXPECT_EQ(test::list_dir(dir.path()), (std::vector<std::string>{"w.safetensors"}));
}

TEST(SafetensorsRoundTrip, WriterRejectsNamesThatAreNotUtf8) {
    test::TempDir dir;
    std::string msg = error_of([&] { write_safetensors(dir.file("u.safetensors"), {{"bad\xff", Tensor::from_f32({1}, {0})}}); });
    EXPECT_TRUE(contains_all(msg, {"u.safetensors", "not valid UTF-8"}));
    EXPECT_TRUE(test::list_dir(dir.path()).empty());
}

TEST(SafetensorsRoundTrip, MappedTensorsAreZeroCopyAndWritesStayPrivate) {
    test::TempDir dir;
    std::string path = dir.file("w.safetensors");
    write_safetensors(path, {{"w", Tensor::from_f32({4}, {1, 2, 3, 4})}});
    std::string before = test::read_bytes(path);
    SafetensorsContents c = load_safetensors(path);
    Tensor w = c.tensors.at("w");
    EXPECT_FALSE(w.storage()->owned);  // points into the mapping
    w.fill(0.0);                       // in-place update (as full fine-tuning does)
    EXPECT_EQ(w.to_f32_vector(), (std::vector<float>{0, 0, 0, 0}));
    EXPECT_EQ(test::read_bytes(path), before);  // the file is never modified
}

// A header of 61 bytes puts the data at offset 69: the F32 tensor cannot be used in place.
TEST(SafetensorsRoundTrip, MisalignedTensorsAreCopied) {
    test::TempDir dir;
    std::string header = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    header.resize(61, ' ');
    test::write_bytes(dir.file("m.safetensors"), st_bytes(header, f32_bytes({1.5f, -2.5f})));
    SafetensorsContents c = load_safetensors(dir.file("m.safetensors"));
    const Tensor& x = c.tensors.at("x");
    EXPECT_TRUE(x.storage()->owned);
    EXPECT_EQ(x.category(), MemCategory::WEIGHTS);
    EXPECT_EQ(x.to_f32_vector(), (std::vector<float>{1.5f, -2.5f}));
}

TEST(SafetensorsRoundTrip, BoolIsReadAsU8) {
    test::TempDir dir;
    std::string header = "{\"mask\":{\"dtype\":\"BOOL\",\"shape\":[4],\"data_offsets\":[0,4]}}";
    test::write_bytes(dir.file("b.safetensors"), st_bytes(header, std::string("\1\0\1\1", 4)));
    SafetensorsContents c = load_safetensors(dir.file("b.safetensors"));
    EXPECT_EQ(c.tensors.at("mask").dtype(), DType::U8);
    EXPECT_EQ(c.tensors.at("mask").to_i64_vector(), (std::vector<int64_t>{1, 0, 1, 1}));
}

TEST(SafetensorsRoundTrip, MappedBytesAreAccountedAsWeights) {
    test::TempDir dir;
    std::string path = dir.file("w.safetensors");
    write_safetensors(path, {{"a", Tensor::zeros({16}, DType::F32)}, {"b", Tensor::zeros({8}, DType::BF16)}});
    MemoryTracker tracker;
    {
        MemoryTrackerScope scope(tracker);
        SafetensorsContents c = load_safetensors(path);
        EXPECT_EQ(tracker.current(Device{}, MemCategory::WEIGHTS), 16 * 4 + 8 * 2);
    }
    EXPECT_EQ(tracker.current(Device{}, MemCategory::WEIGHTS), 0);
}

}  // namespace
}  // namespace kv
