// Small POSIX file helpers for formats/io: read a whole text file with a size bound, and write
// a file atomically (sibling temp file, fsync, rename) so a crash or a reader holding a memory
// map of the old file never sees a half-written one. Knows nothing about formats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kv {

// Whole file as bytes. Throws kv::Error "<path>: cannot read <what>: <reason>" (missing, not a
// regular file, larger than max_bytes).
std::string read_text_file(const std::string& path, const std::string& what, uint64_t max_bytes = 256ull << 20);

bool is_regular_file(const std::string& path);

// Streams bytes into "<path>.tmp.<pid>.<n>"; commit() fsyncs and renames it over `path`.
// Destroying an uncommitted writer removes the temp file and leaves `path` untouched.
class AtomicFileWriter {
   public:
    explicit AtomicFileWriter(std::string path);
    ~AtomicFileWriter();
    AtomicFileWriter(const AtomicFileWriter&) = delete;
    AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

    void write(const void* data, size_t bytes);
    void commit();

   private:
    std::string path_;
    std::string tmp_;
    int fd_ = -1;
};

void write_file_atomic(const std::string& path, const std::string& contents);

}  // namespace kv
