// A minimal Python pickle writer (protocol 2 header) for PyTorch memory snapshots. It emits
// only opcodes that PyTorch's MemoryViz.js unpickler accepts (reference/peers.md C.1): PROTO,
// EMPTY_DICT/EMPTY_LIST + MARK + SETITEMS/APPENDS, SHORT_BINUNICODE/BINUNICODE, BININT1/BININT2/
// BININT, LONG1 (8 bytes) for anything outside int32, BINFLOAT, NEWTRUE/NEWFALSE, NONE, TUPLE2,
// STOP. No memo, no classes, nothing that could execute code when loaded.
#pragma once

#include <cstdint>
#include <ostream>
#include <string_view>

namespace kv::storage {

class PickleWriter {
   public:
    explicit PickleWriter(std::ostream& out);  // writes PROTO 2

    // Containers: begin, then the items (a dict alternates key and value), then end.
    void begin_dict();
    void end_dict();
    void begin_list();
    void end_list();
    // A 2-tuple of the two values written before it (e.g. integer(a); integer(b); tuple2()).
    void tuple2();

    void str(std::string_view s);
    void integer(int64_t v);
    void real(double v);
    void boolean(bool v);
    void none();
    // Convenience for dict entries with a string key.
    void key(std::string_view k) { str(k); }

    // Writes STOP; the stream then holds a complete pickle.
    void finish();

   private:
    void byte(uint8_t b) { out_.put(char(b)); }
    std::ostream& out_;
};

}  // namespace kv::storage
