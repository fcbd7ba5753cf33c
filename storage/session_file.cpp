// Session file open/create (see session_file.h). Nothing may be written to an existing file
// before schema_validate() accepted it.
#include "session_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "storage/schema.h"

namespace kv::storage {

namespace {
std::string dir_of(const std::string& path) {
    auto pos = path.rfind('/');
    if (pos == std::string::npos) return ".";
    return pos == 0 ? "/" : path.substr(0, pos);
}

// file: URI with immutable=1 (percent-encoding what a URI path cannot hold).
std::string immutable_uri(const std::string& path) {
    std::string uri = "file:";
    for (unsigned char c : path) {
        if (std::isalnum(c) || c == '/' || c == '.' || c == '-' || c == '_' || c == '~') {
            uri += char(c);
        } else {
            char buf[4];
            std::snprintf(buf, sizeof buf, "%%%02X", c);
            uri += buf;
        }
    }
    return uri + "?immutable=1";
}

void check_existing(const std::string& path, OpenMode mode) {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) {
        if (errno == ENOENT)
            throw SessionError(SessionErrorKind::NOT_FOUND, str("session file '", path, "' does not exist"),
                               "check the path, or create a new session with this name");
        throw SessionError(SessionErrorKind::NOT_WRITABLE,
                           str("cannot access session file '", path, "': ", std::strerror(errno)));
    }
    if (S_ISDIR(st.st_mode))
        throw SessionError(SessionErrorKind::NOT_A_SESSION,
                           str("'", path, "' is a directory, not a kvlab session file"));
    if (!S_ISREG(st.st_mode))
        throw SessionError(SessionErrorKind::NOT_A_SESSION,
                           str("'", path, "' is not a regular file, so not a kvlab session file"));
    if (st.st_size == 0)
        throw SessionError(SessionErrorKind::NOT_A_SESSION,
                           str("'", path, "' is not a kvlab session file: it is empty"),
                           "delete it or choose another name; kvlab never overwrites an existing file");
    if (access(path.c_str(), R_OK) != 0)
        throw SessionError(SessionErrorKind::NOT_WRITABLE,
                           str("session file '", path, "' is not readable: ", std::strerror(errno)));
    if (mode == OpenMode::READ_WRITE) {
        if (access(path.c_str(), W_OK) != 0)
            throw SessionError(SessionErrorKind::NOT_WRITABLE,
                               str("session file '", path, "' is not writable: ", std::strerror(errno)),
                               "open it read-only to look at it, or fix its permissions");
        // WAL needs FILE-wal and FILE-shm next to the file.
        if (access(dir_of(path).c_str(), W_OK) != 0)
            throw SessionError(
                SessionErrorKind::NOT_WRITABLE,
                str("cannot write session '", path, "': its directory '", dir_of(path),
                    "' is not writable (SQLite keeps FILE-wal and FILE-shm there): ", std::strerror(errno)),
                "open it read-only to look at it, or copy it to a writable directory");
    }
}
}  // namespace

bool session_file_exists(const std::string& path) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0;
}

std::unique_ptr<Db> open_session_db(const std::string& path, OpenMode mode, bool writer) {
    check_existing(path, mode);
    const bool rw = mode == OpenMode::READ_WRITE;
    auto db = std::make_unique<Db>(path, rw ? SQLITE_OPEN_READWRITE : SQLITE_OPEN_READONLY);
    sqlite3_busy_timeout(db->handle(), 5000);
    int version = 0;
    try {
        version = schema_validate(*db);
    } catch (const SessionError& e) {
        // A WAL session in a directory nobody may write to: SQLite cannot create FILE-shm for a
        // plain read-only connection. Nobody can be writing it either (a writer needs the same
        // files), so reading it as an immutable file is exact.
        if (rw || e.kind() != SessionErrorKind::NOT_WRITABLE || access(dir_of(path).c_str(), W_OK) == 0) throw;
        db.reset();
        db = std::make_unique<Db>(path, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, immutable_uri(path));
        version = schema_validate(*db);
    }
    if (rw) {
        // Only now, with the file known to be ours, may anything be written to it.
        if (version < kSchemaVersion) schema_migrate(*db, kSchemaVersion, schema_migrations());
        std::string jm = db->query_text("PRAGMA journal_mode=WAL", "", "switching the session to WAL mode");
        if (jm != "wal")
            throw SessionError(SessionErrorKind::NOT_WRITABLE,
                               str("session '", path, "': cannot use WAL mode (journal_mode is '", jm, "')"),
                               "put the session on a local file system");
    } else if (version < kSchemaVersion) {
        throw SessionError(SessionErrorKind::INVALID,
                           str("session '", path, "' has schema version ", version, "; this build reads version ",
                               kSchemaVersion, " and must upgrade it first"),
                           "open it once read-write (e.g. `kvlab runs FILE`) to migrate it");
    }
    configure_connection(*db, writer || rw);
    return db;
}

std::unique_ptr<Db> create_session_db(const std::string& path) {
    const std::string dir = dir_of(path);
    struct stat st {};
    if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        throw SessionError(SessionErrorKind::NOT_FOUND,
                           str("cannot create session '", path, "': directory '", dir, "' does not exist"));
    // O_EXCL: never clobber a file that appeared since the caller looked.
    int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        if (e == EEXIST)
            throw SessionError(SessionErrorKind::INVALID,
                               str("cannot create session '", path, "': the file already exists"),
                               "open it instead, or choose a new name");
        throw SessionError(
            SessionErrorKind::NOT_WRITABLE,
            str("cannot create session '", path, "': ", std::strerror(e),
                e == EACCES || e == EROFS ? str(" (directory '", dir, "' is not writable)") : std::string()),
            "choose a writable directory");
    }
    ::close(fd);
    try {
        auto db = std::make_unique<Db>(path, SQLITE_OPEN_READWRITE);
        sqlite3_busy_timeout(db->handle(), 5000);
        schema_create(*db);
        configure_connection(*db, true);
        return db;
    } catch (...) {
        // The file is ours and holds nothing: remove it rather than leave a half-made session.
        ::unlink(path.c_str());
        ::unlink((path + "-wal").c_str());
        ::unlink((path + "-shm").c_str());
        throw;
    }
}

}  // namespace kv::storage
