// GGUF container parsing: hand-built files (not GgufWriter) for the layout facts, every malformed
// case with its message (which must name the file), metadata of every value type round-tripping
// through GgufWriter and the parser, and prefix/bit-flip robustness.
#include <gtest/gtest.h>

#include <random>

#include "formats/gguf/gguf_parse.h"
#include "formats/gguf/gguf_reader.h"
#include "formats/gguf/gguf_writer.h"
#include "gguf_test_util.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

using gguf_test::Bytes;
using gguf_test::expect_error;

const std::string kSrc = "bad.gguf";

GgufFile parse(const Bytes& b, const GgufParseLimits& lim = {}) { return gguf_parse(b.b.data(), b.b.size(), kSrc, lim); }

void expect_parse_error(const Bytes& b, std::vector<std::string> parts) {
    parts.insert(parts.begin(), kSrc + ": ");
    expect_error([&] { parse(b); }, parts);
}

// A minimal valid file: one uint32 key, one F32 tensor [4] (ggml ne=[4]) with data 1, 2, 3, 4.
Bytes minimal_file() {
    Bytes b;
    b.header(1, 1).str("general.architecture").u32(8).str("llama");
    b.tensor("t", {4}, 0, 0).pad(32);
    for (float v : {1.f, 2.f, 3.f, 4.f}) b.f32(v);
    return b;
}

// ---- layout facts --------------------------------------------------------------------------
TEST(GgufParse, HandBuiltFileLayout) {
    Bytes b;
    b.header(2, 2).str("general.alignment").u32(4).u32(64).str("k").u32(0).u8(7);
    b.tensor("w", {32, 3}, 8 /*Q8_0*/, 0).tensor("n", {5}, 0, 128);
    const size_t info_end = b.b.size();
    b.pad(64).zeros(128 + 20);  // w at [0, 102), n at [128, 148) of the data section
    GgufFile f = parse(b);
    EXPECT_EQ(f.version, 3u);
    EXPECT_EQ(f.alignment, 64u);
    EXPECT_EQ(f.data_offset, (info_end + 63) / 64 * 64);
    ASSERT_EQ(f.tensors.size(), 2u);
    const GgufTensorInfo& w = f.tensors[0];
    EXPECT_EQ(w.type, GgmlType::Q8_0);
    EXPECT_EQ(w.n_dims, 2);
    EXPECT_EQ(w.ne[0], 32);
    EXPECT_EQ(w.ne[1], 3);
    EXPECT_EQ(w.nbytes, 3u * 34u);
    EXPECT_EQ(w.torch_shape(), (std::vector<int64_t>{3, 32}));  // ggml [in, out] -> torch [out, in]
    EXPECT_EQ(w.file_offset, f.data_offset);
    EXPECT_EQ(f.tensors[1].file_offset, f.data_offset + 128);
    EXPECT_EQ(f.get("k").as_int("k"), 7);
    EXPECT_EQ(f.find_tensor("n"), &f.tensors[1]);
    EXPECT_EQ(f.find("missing"), nullptr);
}

TEST(GgufParse, DefaultAlignmentIs32AndVersion2IsAccepted) {
    Bytes b;
    b.header(1, 0, 2).tensor("t", {2}, 0, 0);
    size_t end = b.b.size();
    b.pad(32).zeros(8);
    GgufFile f = parse(b);
    EXPECT_EQ(f.version, 2u);
    EXPECT_EQ(f.alignment, 32u);
    EXPECT_EQ(f.data_offset, (end + 31) / 32 * 32);
}

TEST(GgufParse, NoTensorsNeedsNoDataSection) {
    Bytes b;
    b.header(0, 1).str("a.b").u32(8).str("x");
    GgufFile f = parse(b);
    EXPECT_TRUE(f.tensors.empty());
    EXPECT_EQ(f.get("a.b").as_string("a.b"), "x");
}

// ---- malformed files: one case each, message names the file and the problem -------------
TEST(GgufParseErrors, BadMagic) {
    expect_parse_error(Bytes{}, {"bad magic", "expected the 4 bytes 'GGUF'"});
    Bytes b;
    b.raw("GGUX").u32(3).u64(0).u64(0);
    expect_parse_error(b, {"not a GGUF file: bad magic 'GGUX'"});
    Bytes c;
    c.raw("GG");
    expect_parse_error(c, {"bad magic 'GG'"});
}

TEST(GgufParseErrors, UnknownVersion) {
    Bytes v1, v4, be;
    v1.header(0, 0, 1);
    v4.header(0, 0, 4);
    be.header(0, 0, 0x03000000u);
    expect_parse_error(v1, {"GGUF version 1", "expected version 2 or 3"});
    expect_parse_error(v4, {"unsupported GGUF version 4, expected 2 or 3"});
    expect_parse_error(be, {"big-endian"});
}

TEST(GgufParseErrors, TruncatedHeader) {
    Bytes b;
    b.raw("GGUF").u32(3).u64(0);
    expect_parse_error(b, {"truncated file: metadata key/value count at byte 16 needs 8 bytes but only 0 remain"});
}

TEST(GgufParseErrors, ImpossibleCounts) {
    Bytes kv, t;
    kv.header(0, uint64_t(1) << 40);
    t.header(uint64_t(1) << 40, 0);
    expect_parse_error(kv, {"metadata key/value count 1099511627776 is impossible"});
    expect_parse_error(t, {"tensor count 1099511627776 is impossible"});
}

TEST(GgufParseErrors, UnknownValueType) {
    Bytes b;
    b.header(0, 1).str("general.name").u32(13).zeros(16);
    expect_parse_error(b, {"metadata key 'general.name' has unknown value type 13, expected 0..12"});
}

TEST(GgufParseErrors, UnknownArrayElementType) {
    Bytes b;
    b.header(0, 1).str("a.arr").u32(9).u32(77).u64(1).zeros(16);
    expect_parse_error(b, {"metadata key 'a.arr' is an array of unknown value type 77"});
}

TEST(GgufParseErrors, BoolOtherThanZeroOrOne) {
    Bytes s, a;
    s.header(0, 1).str("a.flag").u32(7).u8(2);
    a.header(0, 1).str("a.flags").u32(9).u32(7).u64(3).u8(1).u8(0).u8(5);
    expect_parse_error(s, {"metadata key 'a.flag' is bool byte 2, expected 0 or 1"});
    expect_parse_error(a, {"metadata key 'a.flags' element 2 is bool byte 5, expected 0 or 1"});
}

TEST(GgufParseErrors, StringLongerThanFile) {
    Bytes b;
    b.header(0, 1).str("a.s").u32(8).u64(1000).raw("short");
    expect_parse_error(b, {"truncated file: metadata key 'a.s'", "needs 1000 bytes but only 5 remain"});
    Bytes k;
    k.header(0, 1).u64(uint64_t(1) << 20).raw("k").zeros(16);
    expect_parse_error(k, {"metadata key 0 is 1048576 bytes long, expected at most 65535"});
}

TEST(GgufParseErrors, EmptyAndDuplicateKeys) {
    Bytes e, d;
    e.header(0, 1).str("").u32(4).u32(1);
    d.header(0, 2).str("a.k").u32(4).u32(1).str("a.k").u32(4).u32(2);
    expect_parse_error(e, {"metadata key 0 is empty"});
    expect_parse_error(d, {"metadata key 'a.k' appears twice (entries 0 and 1)"});
}

TEST(GgufParseErrors, ArrayCountsBeyondFileAndLimits) {
    Bytes n, s, huge;
    n.header(0, 1).str("a.n").u32(9).u32(5).u64(1000).zeros(12);
    s.header(0, 1).str("a.s").u32(9).u32(8).u64(100).zeros(12);
    huge.header(0, 1).str("a.h").u32(9).u32(0).u64(uint64_t(1) << 40);
    expect_parse_error(n, {"truncated file: metadata key 'a.n' (1000 × int32)", "needs 4000 bytes"});
    expect_parse_error(s, {"truncated file: metadata key 'a.s' (100 strings)"});
    expect_parse_error(huge, {"metadata key 'a.h' has 1099511627776 elements, expected at most 1073741824"});
}

TEST(GgufParseErrors, ArraysNestedTooDeep) {
    Bytes b;
    b.header(0, 1).str("a.deep").u32(9);
    for (int i = 0; i < 10; ++i) b.u32(9).u64(1);
    b.u32(4).u64(0);
    expect_parse_error(b, {"metadata key 'a.deep' element 0 element 0", "nests arrays deeper than 8 levels"});
}

TEST(GgufParseErrors, BadAlignment) {
    Bytes np2, str, zero;
    np2.header(0, 1).str("general.alignment").u32(4).u32(48);
    str.header(0, 1).str("general.alignment").u32(8).str("32");
    zero.header(0, 1).str("general.alignment").u32(4).u32(0);
    expect_parse_error(np2, {"general.alignment is uint32 48, expected a power of two"});
    expect_parse_error(str, {"metadata key 'general.alignment' is string '32', expected a uint32 power of two"});
    expect_parse_error(zero, {"general.alignment is uint32 0"});
}

TEST(GgufParseErrors, TooManyDims) {
    Bytes b;
    b.header(1, 0).tensor("t", {1, 1, 1, 1, 1}, 0, 0);
    expect_parse_error(b, {"tensor 't' has 5 dimensions, expected at most 4"});
}

TEST(GgufParseErrors, UnknownTensorType) {
    Bytes removed, unknown;
    removed.header(1, 0).tensor("old", {32}, 4, 0);  // Q4_2: removed from the format
    unknown.header(1, 0).tensor("x", {32}, 99, 0);
    expect_parse_error(removed, {"tensor 'old' has unknown ggml type id 4"});
    expect_parse_error(unknown, {"tensor 'x' has unknown ggml type id 99"});
}

TEST(GgufParseErrors, DimsNotDivisibleByBlockSize) {
    Bytes q40, q4k;
    q40.header(1, 0).tensor("w", {33, 2}, 2, 0);
    q4k.header(1, 0).tensor("k", {128, 4}, 12, 0);
    expect_parse_error(q40, {"tensor 'w' of type Q4_0 has ne=[33, 2]: ne[0] = 33 elements per row is not a multiple of "
                             "the block size 32"});
    expect_parse_error(q4k, {"tensor 'k' of type Q4_K", "not a multiple of the block size 256"});
}

TEST(GgufParseErrors, ElementCountOverflow) {
    Bytes b, big;
    b.header(1, 0).tensor("t", {uint64_t(1) << 32, uint64_t(1) << 32}, 0, 0);
    big.header(1, 0).tensor("t", {~uint64_t(0)}, 0, 0);
    expect_parse_error(b, {"tensor 't'", "more than 2^62 elements"});
    expect_parse_error(big, {"tensor 't' ne[0] = 18446744073709551615 is out of range"});
}

TEST(GgufParseErrors, MisalignedOffset) {
    Bytes b;
    b.header(1, 0).tensor("t", {4}, 0, 16).pad(32).zeros(64);
    expect_parse_error(b, {"tensor 't' data offset 16 is not a multiple of the alignment 32"});
}

TEST(GgufParseErrors, DataPastEndOfFile) {
    Bytes off, trunc;
    off.header(1, 0).tensor("t", {4}, 0, 1024).pad(32).zeros(16);
    expect_parse_error(off, {"tensor 't' data (16 bytes at offset 1024", "extends past the end of the file (16 data bytes)"});
    Bytes full = minimal_file();
    trunc.b.assign(full.b.begin(), full.b.end() - 1);
    expect_parse_error(trunc, {"tensor 't' data (16 bytes at offset 0", "extends past the end of the file (15 data bytes)"});
    Bytes nodata;
    nodata.header(1, 0).tensor("t", {4}, 0, 0);
    expect_parse_error(nodata, {"truncated file: the data section starts at byte"});
}

TEST(GgufParseErrors, OverlappingTensors) {
    Bytes b;
    b.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad(32).zeros(128);
    expect_parse_error(b, {"tensors 'a' [0, 64) and 'b' [32, 96) overlap"});
}

TEST(GgufParseErrors, DuplicateAndLongTensorNames) {
    Bytes d, l;
    d.header(2, 0).tensor("a", {8}, 0, 0).tensor("a", {8}, 0, 32).pad(32).zeros(64);
    l.header(1, 0).tensor(std::string(64, 'n'), {8}, 0, 0);
    expect_parse_error(d, {"tensor name 'a' appears twice (tensors 0 and 1)"});
    expect_parse_error(l, {"name of tensor 0 is 64 bytes long, expected at most 63"});
}

TEST(GgufParseErrors, ReaderNamesThePath) {
    gguf_test::TempDir dir;
    const std::string missing = dir.file("nope.gguf");
    expect_error([&] { GgufReader r(missing); }, {missing + ": cannot open GGUF file"});
    expect_error([&] { GgufReader r(dir.path.string()); }, {dir.path.string() + ": not a regular file"});
    const std::string empty = dir.file("empty.gguf");
    Bytes junk;
    junk.raw("PK\x03\x04 this is a zip");
    std::FILE* fp = std::fopen(empty.c_str(), "wb");
    std::fwrite(junk.b.data(), 1, junk.b.size(), fp);
    std::fclose(fp);
    expect_error([&] { GgufReader r(empty); }, {empty + ": not a GGUF file: bad magic 'PK\\x03\\x04'"});
}

// ---- robustness: every prefix and random corruption either parses or throws kv::Error -----
TEST(GgufParse, EveryPrefixOfAValidFileFailsCleanly) {
    Bytes full = minimal_file();
    const GgufFile ok = parse(full);
    const size_t data_end = ok.tensors[0].file_offset + ok.tensors[0].nbytes;
    for (size_t n = 0; n < full.b.size(); ++n) {
        Bytes p;
        p.b.assign(full.b.begin(), full.b.begin() + long(n));
        bool threw = false;
        try {
            parse(p);
        } catch (const Error& e) {
            threw = true;
            EXPECT_EQ(std::string(e.what()).rfind(kSrc + ": ", 0), 0u) << e.what();
        }
        EXPECT_EQ(threw, n < data_end) << "prefix of " << n << " bytes";
    }
}

TEST(GgufParse, RandomCorruptionNeverCrashes) {
    GgufWriter w;
    w.set("general.architecture", GgufValue::of_string("llama"));
    w.set("a.arr", GgufValue::of_string_array({"x", "yy", "zzz"}));
    w.add_float_tensor("t", {2, 32}, std::vector<float>(64, 1.0f));
    w.add_tensor("q", GgmlType::Q4_K, {256}, std::vector<uint8_t>(144, 7));
    const std::vector<uint8_t> good = w.bytes();
    std::mt19937_64 rng(test::seed_for("GgufParse.RandomCorruption"));
    int errors = 0;
    for (int iter = 0; iter < 3000; ++iter) {
        std::vector<uint8_t> b = good;
        const int flips = 1 + int(rng() % 4);
        for (int k = 0; k < flips; ++k) b[rng() % b.size()] ^= uint8_t(1u << (rng() % 8));
        try {
            gguf_parse(b.data(), b.size(), kSrc);
        } catch (const Error&) {
            ++errors;
        }
    }
    EXPECT_GT(errors, 0);
}

// ---- metadata of every value type round-trips through GgufWriter and the parser -----------
TEST(GgufMetadata, EveryValueTypeRoundTrips) {
    using V = GgufValue;
    std::vector<std::pair<std::string, V>> kv = {
        {"t.u8", V::of_u8(255)},
        {"t.i8", V::of_i8(-128)},
        {"t.u16", V::of_u16(65535)},
        {"t.i16", V::of_i16(-32768)},
        {"t.u32", V::of_u32(4294967295u)},
        {"t.i32", V::of_i32(-2147483647 - 1)},
        {"t.f32", V::of_f32(-1.5e-7f)},
        {"t.bool_true", V::of_bool(true)},
        {"t.bool_false", V::of_bool(false)},
        {"t.string", V::of_string(std::string("héllo\n\0x", 9))},
        {"t.empty_string", V::of_string("")},
        {"t.u64", V::of_u64(~uint64_t(0))},
        {"t.i64", V::of_i64(INT64_MIN)},
        {"t.f64", V::of_f64(3.141592653589793)},
        {"a.u8", V::of_array(GgufValueType::UINT8, {V::of_u8(0), V::of_u8(200)})},
        {"a.i8", V::of_array(GgufValueType::INT8, {V::of_i8(-1), V::of_i8(127)})},
        {"a.u16", V::of_array(GgufValueType::UINT16, {V::of_u16(1), V::of_u16(60000)})},
        {"a.i16", V::of_array(GgufValueType::INT16, {V::of_i16(-300)})},
        {"a.u32", V::of_array(GgufValueType::UINT32, {V::of_u32(7), V::of_u32(8), V::of_u32(9)})},
        {"a.i32", V::of_i32_array({3, 3, 1, 6})},
        {"a.f32", V::of_f32_array({0.5f, -2.0f})},
        {"a.bool", V::of_array(GgufValueType::BOOL, {V::of_bool(true), V::of_bool(false), V::of_bool(true)})},
        {"a.string", V::of_string_array({"Ġ t", "", "<|im_end|>"})},
        {"a.u64", V::of_array(GgufValueType::UINT64, {V::of_u64(1ull << 63)})},
        {"a.i64", V::of_array(GgufValueType::INT64, {V::of_i64(-5), V::of_i64(INT64_MAX)})},
        {"a.f64", V::of_array(GgufValueType::FLOAT64, {V::of_f64(1e300), V::of_f64(-0.0)})},
        {"a.empty", V::of_array(GgufValueType::FLOAT32, {})},
        {"a.nested_strings", V::of_array(GgufValueType::ARRAY, {V::of_string_array({"a", "b"}), V::of_string_array({}),
                                                                V::of_string_array({"ccc"})})},
        {"a.nested_deep", V::of_array(GgufValueType::ARRAY,
                                      {V::of_array(GgufValueType::ARRAY, {V::of_i32_array({1, 2})})})},
    };
    GgufWriter w;
    for (const auto& [k, v] : kv) w.set(k, v);
    const std::vector<uint8_t> bytes = w.bytes();
    GgufFile f = gguf_parse(bytes.data(), bytes.size(), "roundtrip.gguf");
    ASSERT_EQ(f.metadata.size(), kv.size());
    for (size_t i = 0; i < kv.size(); ++i) {
        EXPECT_EQ(f.metadata[i].first, kv[i].first);  // file order kept
        EXPECT_TRUE(f.metadata[i].second == kv[i].second) << kv[i].first << ": " << f.metadata[i].second.describe();
        EXPECT_EQ(f.metadata[i].second.type, kv[i].second.type) << kv[i].first;
    }
    // Typed accessors decode what was written.
    EXPECT_EQ(f.get("t.u8").as_int("u8"), 255);
    EXPECT_EQ(f.get("t.i8").as_int("i8"), -128);
    EXPECT_EQ(f.get("t.u16").as_int("u16"), 65535);
    EXPECT_EQ(f.get("t.i16").as_int("i16"), -32768);
    EXPECT_EQ(f.get("t.u32").as_int("u32"), 4294967295LL);
    EXPECT_EQ(f.get("t.i32").as_int("i32"), -2147483648LL);
    EXPECT_EQ(f.get("t.f32").as_float("f32"), double(-1.5e-7f));
    EXPECT_TRUE(f.get("t.bool_true").as_bool("b"));
    EXPECT_FALSE(f.get("t.bool_false").as_bool("b"));
    EXPECT_EQ(f.get("t.string").as_string("s"), std::string("héllo\n\0x", 9));
    EXPECT_EQ(f.get("t.i64").as_int("i64"), INT64_MIN);
    EXPECT_EQ(f.get("t.f64").as_float("f64"), 3.141592653589793);
    EXPECT_EQ(f.get("a.i32").as_int_array("a"), (std::vector<int64_t>{3, 3, 1, 6}));
    EXPECT_EQ(f.get("a.u16").as_int_array("a"), (std::vector<int64_t>{1, 60000}));
    EXPECT_EQ(f.get("a.f32").as_float_array("a"), (std::vector<double>{0.5, -2.0}));
    EXPECT_EQ(f.get("a.string").as_string_array("a"), (std::vector<std::string>{"Ġ t", "", "<|im_end|>"}));
    EXPECT_EQ(f.get("a.nested_strings").arrays.at(2).strings.at(0), "ccc");
    EXPECT_EQ(f.get("a.nested_deep").arrays.at(0).arrays.at(0).as_int_array("n"), (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(f.get("a.empty").size(), 0u);
    // Mismatched conversions name the value and both types.
    expect_error([&] { f.get("t.u64").as_int(f.what("t.u64")); },
                 {"roundtrip.gguf: metadata key 't.u64': value 18446744073709551615 is too large"});
    expect_error([&] { f.get("t.string").as_int(f.what("t.string")); },
                 {"metadata key 't.string': is string 'héllo", "expected an integer"});
    expect_error([&] { f.get("a.f32").as_int_array(f.what("a.f32")); },
                 {"is array[float32; 2], expected an array of integers"});
    expect_error([&] { f.get("t.u8").as_bool(f.what("t.u8")); }, {"is uint8 255, expected a bool"});
    expect_error([&] { f.get("missing.key"); }, {"roundtrip.gguf: metadata key 'missing.key' is missing"});
    // Written again, the bytes are identical.
    GgufWriter w2;
    for (const auto& [k, v] : f.metadata) w2.set(k, v);
    EXPECT_EQ(w2.bytes(), bytes);
}

TEST(GgufMetadata, WriterAlignmentAndTensorsParse) {
    GgufWriter w;
    w.set_alignment(64);
    w.add_float_tensor("a", {3, 2}, {1, 2, 3, 4, 5, 6}, GgmlType::F32);
    w.add_float_tensor("b", {4}, {0.5f, -1, 2, 65504}, GgmlType::F16);
    w.add_float_tensor("c", {2}, {1.0f, -3.0f}, GgmlType::BF16);
    std::vector<uint8_t> bytes = w.bytes();
    GgufFile f = gguf_parse(bytes.data(), bytes.size(), "w.gguf");
    EXPECT_EQ(f.alignment, 64u);
    EXPECT_EQ(f.data_offset % 64, 0u);
    ASSERT_EQ(f.tensors.size(), 3u);
    EXPECT_EQ(f.tensors[0].torch_shape(), (std::vector<int64_t>{3, 2}));
    EXPECT_EQ(f.tensors[0].ne[0], 2);
    for (const GgufTensorInfo& t : f.tensors) EXPECT_EQ(t.file_offset % 64, 0u) << t.name;
    float v;
    std::memcpy(&v, bytes.data() + f.tensors[0].file_offset + 4 * 5, 4);
    EXPECT_EQ(v, 6.0f);
    expect_error([&] { w.add_tensor("bad", GgmlType::Q8_0, {32}, std::vector<uint8_t>(33)); },
                 {"tensor 'bad' of type Q8_0 needs 34 bytes, got 33"});
}

}  // namespace
}  // namespace kv
