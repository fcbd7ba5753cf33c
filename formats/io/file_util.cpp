// POSIX implementation of the formats/io file helpers (see file_util.h).
#include "formats/io/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "engine/core/error.h"

namespace kv {

namespace {
std::string errno_text() { return std::strerror(errno); }

std::string parent_dir(const std::string& path) {
    size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}
}  // namespace

bool is_regular_file(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string read_text_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(str(path, ": cannot read ", what, ": ", errno_text()));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        throw Error(str(path, ": cannot read ", what, ": not a regular file"));
    }
    if (uint64_t(st.st_size) > max_bytes) {
        ::close(fd);
        throw Error(str(path, ": cannot read ", what, ": the file has ", st.st_size, " bytes; expected at most ", max_bytes));
    }
    std::string out(size_t(st.st_size), '\0');
    size_t done = 0;
    while (done < out.size()) {
        ssize_t n = ::read(fd, out.data() + done, out.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // shrank while reading: keep what is there
        done += size_t(n);
    }
    ::close(fd);
    out.resize(done);
    return out;
}

// ---- AtomicFileWriter -------------------------------------------------------------------
AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
    static std::atomic<uint64_t> counter{0};
    // O_EXCL with a fresh name per attempt; mode 0666 so the umask applies as for any new file.
    for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
        tmp_ = str(path_, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
        fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd_ < 0 && errno != EEXIST) break;
    }
    if (fd_ < 0) throw Error(str(path_, ": cannot create a temporary file next to it: ", errno_text()));
}

AtomicFileWriter::~AtomicFileWriter() {
    if (fd_ >= 0) {
        ::close(fd_);
        ::unlink(tmp_.c_str());
    }
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
    if (fd_ < 0) throw Error(str(path_, ": write after commit"));
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
        ssize_t n = ::write(fd_, p, bytes);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw Error(str(path_, ": write failed: ", errno_text()));
        p += n;
        bytes -= size_t(n);
    }
}

void AtomicFileWriter::commit() {
    if (fd_ < 0) throw Error(str(path_, ": commit called twice"));
    if (::fsync(fd_) != 0) throw Error(str(path_, ": fsync failed: ", errno_text()));
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0 || ::rename(tmp_.c_str(), path_.c_str()) != 0) {
        std::string why = errno_text();
        ::unlink(tmp_.c_str());
        throw Error(str(path_, ": cannot replace the file: ", why));
    }
    // Make the rename itself durable; failure here loses nothing already visible.
    int dfd = ::open(parent_dir(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
}

void write_file_atomic(const std::string& path, const std::string& contents) {
    AtomicFileWriter w(path);
    w.write(contents.data(), contents.size());
    w.commit();
}

}  // namespace kv
