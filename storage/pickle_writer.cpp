// Pickle opcodes (see pickle_writer.h). Integers are little-endian; BINFLOAT is big-endian.
// Adding an opcode outside reference/peers.md C.1 would break pytorch.org/memory_viz.
#include "pickle_writer.h"

#include <cstring>

namespace kv::storage {

namespace {
// Opcode bytes, named as in CPython's pickle.py.
constexpr uint8_t PROTO = 0x80, STOP = '.', MARK = '(', EMPTY_DICT = '}', EMPTY_LIST = ']', SETITEMS = 'u',
                  APPENDS = 'e', TUPLE2 = 0x86, SHORT_BINUNICODE = 0x8c, BINUNICODE = 'X', BININT1 = 'K', BININT2 = 'M',
                  BININT = 'J', LONG1 = 0x8a, BINFLOAT = 'G', NEWTRUE = 0x88, NEWFALSE = 0x89, NONE = 'N';
}  // namespace

PickleWriter::PickleWriter(std::ostream& out) : out_(out) {
    byte(PROTO);
    byte(2);
}

void PickleWriter::begin_dict() {
    byte(EMPTY_DICT);
    byte(MARK);
}
void PickleWriter::end_dict() { byte(SETITEMS); }
void PickleWriter::begin_list() {
    byte(EMPTY_LIST);
    byte(MARK);
}
void PickleWriter::end_list() { byte(APPENDS); }
void PickleWriter::tuple2() { byte(TUPLE2); }

void PickleWriter::str(std::string_view s) {
    if (s.size() < 256) {
        byte(SHORT_BINUNICODE);
        byte(uint8_t(s.size()));
    } else {
        byte(BINUNICODE);
        uint32_t n = uint32_t(s.size());
        for (int i = 0; i < 4; ++i) byte(uint8_t(n >> (8 * i)));
    }
    out_.write(s.data(), std::streamsize(s.size()));
}

void PickleWriter::integer(int64_t v) {
    if (v >= 0 && v < 256) {
        byte(BININT1);
        byte(uint8_t(v));
    } else if (v >= 0 && v < 65536) {
        byte(BININT2);
        byte(uint8_t(v));
        byte(uint8_t(v >> 8));
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        byte(BININT);
        uint32_t u = uint32_t(int32_t(v));
        for (int i = 0; i < 4; ++i) byte(uint8_t(u >> (8 * i)));
    } else {
        // LONG1 with 8 bytes of little-endian two's complement (addresses, sizes >= 2^31).
        byte(LONG1);
        byte(8);
        uint64_t u = uint64_t(v);
        for (int i = 0; i < 8; ++i) byte(uint8_t(u >> (8 * i)));
    }
}

void PickleWriter::real(double v) {
    byte(BINFLOAT);
    uint64_t u;
    std::memcpy(&u, &v, sizeof u);
    for (int i = 7; i >= 0; --i) byte(uint8_t(u >> (8 * i)));
}

void PickleWriter::boolean(bool v) { byte(v ? NEWTRUE : NEWFALSE); }
void PickleWriter::none() { byte(NONE); }
void PickleWriter::finish() { byte(STOP); }

}  // namespace kv::storage
