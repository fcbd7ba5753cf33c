// Malformed safetensors files: every rule of the format gets a file that breaks it, and the
// test checks that the error names the file and says what was wrong.
#include <gtest/gtest.h>

#include "formats/io/safetensors_file.h"
#include "formats/io/safetensors_parse.h"
#include "modelio_test_util.h"

namespace kv {
namespace {

using test::contains_all;
using test::error_of;
using test::le_u64;
using test::st_bytes;

std::string parse_error(const std::string& bytes) {
    return error_of([&] { parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "bad.safetensors"); });
}

std::string entry(const char* name, const char* dtype, const char* shape, uint64_t b, uint64_t e) {
    return str("\"", name, "\":{\"dtype\":\"", dtype, "\",\"shape\":", shape, ",\"data_offsets\":[", b, ",", e, "]}");
}

// "{e1,e2,...}" (built with str(): GCC 12 warns falsely on `"{" + std::string` at -O3).
std::string obj(std::initializer_list<std::string> entries) {
    std::string s;
    for (const auto& e : entries) s = s.empty() ? e : str(s, ",", e);
    return str("{", s, "}");
}

TEST(SafetensorsMalformed, TruncatedFile) {
    EXPECT_TRUE(contains_all(parse_error(""), {"bad.safetensors", "truncated", "0 bytes"}));
    EXPECT_TRUE(contains_all(parse_error(std::string("\x10\0\0", 3)), {"bad.safetensors", "truncated", "8-byte"}));
    // A valid file cut inside the data section.
    std::string ok = st_bytes(obj({entry("a", "F32", "[4]", 0, 16)}), std::string(16, '\0'));
    EXPECT_TRUE(contains_all(parse_error(ok.substr(0, ok.size() - 3)), {"'a'", "run past the end of the data section (13 bytes)"}));
}

TEST(SafetensorsMalformed, HeaderLengthPastTheEnd) {
    EXPECT_TRUE(contains_all(parse_error(le_u64(100) + "{}"), {"bad.safetensors", "header length 100 runs past the end of the file (10 bytes"}));
    EXPECT_TRUE(contains_all(parse_error(le_u64(~0ull) + "{}"), {"exceeds the maximum of 100000000"}));
    EXPECT_TRUE(contains_all(parse_error(le_u64(100'000'001) + "{}"), {"exceeds the maximum"}));
}

TEST(SafetensorsMalformed, HeaderNotJsonOrNotAnObject) {
    EXPECT_TRUE(contains_all(parse_error(st_bytes("{not json}", "")), {"bad.safetensors", "not valid JSON"}));
    EXPECT_TRUE(contains_all(parse_error(st_bytes("[1, 2]", "")), {"must be a JSON object starting with '{'"}));
    EXPECT_TRUE(contains_all(parse_error(st_bytes(" {}", "")), {"starting with '{'"}));
    EXPECT_TRUE(contains_all(parse_error(st_bytes("", "")), {"starting with '{'"}));
    EXPECT_TRUE(contains_all(parse_error(st_bytes("{} x", "")), {"not valid JSON"}));
    EXPECT_TRUE(contains_all(parse_error(st_bytes(std::string("{}\0\0\0\0", 6), "")), {"not valid JSON"}));
    EXPECT_TRUE(contains_all(parse_error(st_bytes("{\"a\xff\":1}", "")), {"not valid JSON"}));  // not UTF-8
    std::string deep = "{\"x\":" + std::string(100, '[') + std::string(100, ']') + "}";
    EXPECT_TRUE(contains_all(parse_error(st_bytes(deep, "")), {"nested deeper than 64 levels"}));
    // Padding with spaces (and any JSON whitespace) after the object is allowed.
    EXPECT_EQ(parse_error(st_bytes("{}      ", "")), "<no error>");
}

TEST(SafetensorsMalformed, OverlappingOffsets) {
    std::string h = obj({entry("a", "F32", "[2]", 0, 8), entry("b", "F32", "[2]", 4, 12)});
    EXPECT_TRUE(contains_all(parse_error(st_bytes(h, std::string(12, '\0'))), {"bad.safetensors", "'a' [0, 8)", "'b' [4, 12)", "overlap"}));
    // The same range twice.
    h = obj({entry("a", "F32", "[2]", 0, 8), entry("b", "F32", "[2]", 0, 8)});
    EXPECT_TRUE(contains_all(parse_error(st_bytes(h, std::string(8, '\0'))), {"overlap"}));
}

TEST(SafetensorsMalformed, OffsetsOutOfRange) {
    std::string h = obj({entry("a", "F32", "[4]", 0, 16)});
    EXPECT_TRUE(contains_all(parse_error(st_bytes(h, std::string(8, '\0'))),
                             {"bad.safetensors", "tensor 'a'", "data_offsets [0, 16] run past the end of the data section (8 bytes)"}));
    h = obj({entry("a", "F32", "[1]", 8, 4)});
    EXPECT_TRUE(contains_all(parse_error(st_bytes(h, std::string(8, '\0'))), {"data_offsets [8, 4] end before they begin"}));
    h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,18446744073709551615]}}";
    EXPECT_TRUE(contains_all(parse_error(st_bytes(h, std::string(4, '\0'))), {"run past the end"}));
}

TEST(SafetensorsMalformed, HolesAndTrailingBytes) {
    std::string h = obj({entry("a", "F32", "[1]", 0, 4), entry("b", "F32", "[1]", 8, 12)});
    EXPECT_TRUE(contains_all(parse_error(st_bytes(h, std::string(12, '\0'))),
                             {"bad.safetensors", "bytes [4, 8) of the data section are not covered", "before 'b'"}));
    h = obj({entry("a", "F32", "[1]", 4, 8)});
    EXPECT_TRUE(contains_all(parse_error(st_bytes(h, std::string(8, '\0'))), {"bytes [0, 4) of the data section are not covered"}));
    h = obj({entry("a", "F32", "[1]", 0, 4)});
    EXPECT_TRUE(contains_all(parse_error(st_bytes(h, std::string(9, '\0'))), {"bytes [4, 9) at the end of the data section are not covered"}));
    EXPECT_TRUE(contains_all(parse_error(st_bytes("{}", "x")), {"bytes [0, 1) at the end"}));
}

TEST(SafetensorsMalformed, SizeDoesNotMatchShapeTimesDtype) {
    std::string h = obj({entry("w", "F32", "[2,2]", 0, 12)});
    EXPECT_TRUE(contains_all(parse_error(st_bytes(h, std::string(12, '\0'))),
                             {"bad.safetensors", "tensor 'w'", "hold 12 bytes but dtype F32 with shape [2, 2] needs 16 bytes"}));
    h = obj({entry("w", "BF16", "[3]", 0, 8)});
    EXPECT_TRUE(contains_all(parse_error(st_bytes(h, std::string(8, '\0'))), {"needs 6 bytes"}));
    h = obj({entry("w", "F32", "[4611686018427387904,8]", 0, 8)});
    EXPECT_TRUE(contains_all(parse_error(st_bytes(h, std::string(8, '\0'))), {"more elements than fit in 64 bits"}));
    h = obj({entry("w", "F64", "[2305843009213693952]", 0, 8)});
    EXPECT_TRUE(contains_all(parse_error(st_bytes(h, std::string(8, '\0'))), {"more bytes than fit in 64 bits"}));
    h = obj({entry("w", "F4", "[3]", 0, 2)});
    EXPECT_TRUE(contains_all(parse_error(st_bytes(h, std::string(2, '\0'))), {"byte boundary"}));
    h = obj({entry("w", "F4", "[4]", 0, 2)});  // 4 × 4 bits = 2 bytes: valid
    EXPECT_EQ(parse_error(st_bytes(h, std::string(2, '\0'))), "<no error>");
}

TEST(SafetensorsMalformed, UnknownAndUnloadableDtypes) {
    std::string h = obj({entry("w", "F128", "[1]", 0, 16)});
    EXPECT_TRUE(contains_all(parse_error(st_bytes(h, std::string(16, '\0'))),
                             {"bad.safetensors", "tensor 'w'", "unknown dtype string \"F128\"", "expected one of BOOL, F4"}));
    h = obj({entry("w", "f32", "[1]", 0, 4)});  // names are case-sensitive
    EXPECT_TRUE(contains_all(parse_error(st_bytes(h, std::string(4, '\0'))), {"unknown dtype string \"f32\""}));
    h = "{\"w\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,4]}}";
    EXPECT_TRUE(contains_all(parse_error(st_bytes(h, std::string(4, '\0'))), {"\"dtype\" must be a string, got number 3"}));

    // Valid in the format but not representable as a kv::DType: the loader names the dtype.
    test::TempDir dir;
    for (const char* dt : {"I8", "U16", "I16", "U32", "U64", "C64", "F8_E4M3"}) {
        int bytes = st_dtype_bits(*st_dtype_from_name(dt)) / 8;
        std::string hh = obj({entry("w", dt, "[2]", 0, uint64_t(2 * bytes))});
        test::write_bytes(dir.file("d.safetensors"), st_bytes(hh, std::string(size_t(2 * bytes), '\0')));
        std::string msg = error_of([&] { load_safetensors(dir.file("d.safetensors")); });
        EXPECT_TRUE(contains_all(msg, {"d.safetensors", "tensor 'w' has dtype ", dt, "which kvlab cannot hold", "supported dtypes: F32"})) << dt;
    }
}

TEST(SafetensorsMalformed, DuplicateKey) {
    std::string h = obj({entry("a", "F32", "[1]", 0, 4), entry("a", "F32", "[1]", 4, 8)});
    EXPECT_TRUE(contains_all(parse_error(st_bytes(h, std::string(8, '\0'))), {"bad.safetensors", "duplicate key 'a'"}));
    h = "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}";
    EXPECT_TRUE(contains_all(parse_error(st_bytes(h, "")), {"duplicate key 'k'"}));
}

TEST(SafetensorsMalformed, MetadataMustMapStringsToStrings) {
    EXPECT_TRUE(contains_all(parse_error(st_bytes("{\"__metadata__\":{\"format\":1}}", "")),
                             {"bad.safetensors", "\"__metadata__\" value for key 'format' must be a string, got number 1"}));
    EXPECT_TRUE(contains_all(parse_error(st_bytes("{\"__metadata__\":{\"nested\":{}}}", "")), {"key 'nested' must be a string, got object"}));
    EXPECT_TRUE(contains_all(parse_error(st_bytes("{\"__metadata__\":[\"pt\"]}", "")), {"\"__metadata__\" must be an object"}));
    EXPECT_EQ(parse_error(st_bytes("{\"__metadata__\":null}", "")), "<no error>");  // as the reference reader
}

TEST(SafetensorsMalformed, EntryFields) {
    auto one = [](const std::string& body, size_t data = 4) { return parse_error(st_bytes("{\"w\":" + body + "}", std::string(data, '\0'))); };
    EXPECT_TRUE(contains_all(one("5"), {"tensor 'w'", "entry must be an object"}));
    EXPECT_TRUE(contains_all(one("{\"shape\":[1],\"data_offsets\":[0,4]}"), {"missing \"dtype\""}));
    EXPECT_TRUE(contains_all(one("{\"dtype\":\"F32\",\"data_offsets\":[0,4]}"), {"missing \"shape\""}));
    EXPECT_TRUE(contains_all(one("{\"dtype\":\"F32\",\"shape\":[1]}"), {"missing \"data_offsets\""}));
    EXPECT_TRUE(contains_all(one("{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}"), {"non-negative integers, found number -1"}));
    EXPECT_TRUE(contains_all(one("{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}"), {"non-negative integers"}));
    EXPECT_TRUE(contains_all(one("{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}"), {"\"shape\" must be a list"}));
    EXPECT_TRUE(contains_all(one("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}"), {"\"data_offsets\" must be [BEGIN, END]", "[0]"}));
    EXPECT_TRUE(contains_all(one("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}"), {"must be [BEGIN, END]"}));
    EXPECT_TRUE(contains_all(one("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}"), {"must be [BEGIN, END]"}));
    EXPECT_TRUE(contains_all(one("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",4]}"), {"must be [BEGIN, END]"}));
    // Unknown extra fields are ignored, as by the reference reader.
    EXPECT_EQ(one("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":true}"), "<no error>");
}

TEST(SafetensorsMalformed, LoaderErrorsNameTheFile) {
    test::TempDir dir;
    EXPECT_TRUE(contains_all(error_of([&] { load_safetensors(dir.file("missing.safetensors")); }),
                             {"missing.safetensors", "cannot open safetensors file", "No such file"}));
    EXPECT_TRUE(contains_all(error_of([&] { load_safetensors(dir.path()); }), {"not a regular file"}));
    test::write_bytes(dir.file("empty.safetensors"), "");
    EXPECT_TRUE(contains_all(error_of([&] { load_safetensors(dir.file("empty.safetensors")); }), {"empty.safetensors", "truncated"}));
    std::string h = obj({entry("w", "F32", "[1,1,1,1,1,1,1]", 0, 4)});
    test::write_bytes(dir.file("rank.safetensors"), st_bytes(h, std::string(4, '\0')));
    EXPECT_TRUE(contains_all(error_of([&] { load_safetensors(dir.file("rank.safetensors")); }),
                             {"rank.safetensors", "tensor 'w' has rank 7", "at most 6 dimensions"}));
    // Zero elements, but strides that would overflow.
    h = obj({entry("w", "F32", "[0,4611686018427387904,4611686018427387904]", 0, 0)});
    test::write_bytes(dir.file("huge.safetensors"), st_bytes(h, ""));
    EXPECT_TRUE(contains_all(error_of([&] { load_safetensors(dir.file("huge.safetensors")); }),
                             {"huge.safetensors", "tensor 'w'", "multiply beyond 64 bits"}));
}

}  // namespace
}  // namespace kv
