// Session file open/create (see session_file.h). Nothing may be written to an existing file
// before schema_validate() accepted it.
#include "session_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
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

std::unique_ptr<Db> open_session_db(const std::string& path, OpenMode mode, bool writer, const char* vfs) {
    check_existing(path, mode);
    const bool rw = mode == OpenMode::READ_WRITE;
    auto db = std::make_unique<Db>(path, rw ? SQLITE_OPEN_READWRITE : SQLITE_OPEN_READONLY, "", vfs);
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

namespace {
std::string base_of(const std::string& path) {
    auto pos = path.rfind('/');
    return pos == std::string::npos ? path : path.substr(pos + 1);
}

// Writes a complete new session into `tmp` (which must not exist) and closes it: SQLite folds
// the WAL back into the file on the last close, so `tmp` alone is the whole session.
void build_session_file(const std::string& tmp, const std::string& path, const std::string& dir) {
    int fd = ::open(tmp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        throw SessionError(
            SessionErrorKind::NOT_WRITABLE,
            str("cannot create session '", path, "': ", std::strerror(e),
                e == EACCES || e == EROFS ? str(" (directory '", dir, "' is not writable)") : std::string()),
            "choose a writable directory");
    }
    ::close(fd);
    try {
        Db db(tmp, SQLITE_OPEN_READWRITE);
        sqlite3_busy_timeout(db.handle(), 5000);
        schema_create(db);
        // Fold the WAL into the file now and check it: a checkpoint that runs out of space on
        // close fails silently and would leave a truncated file to link into place.
        int log = -1, done = -1;
        const int rc = sqlite3_wal_checkpoint_v2(db.handle(), nullptr, SQLITE_CHECKPOINT_TRUNCATE, &log, &done);
        const int64_t want = db.query_int("PRAGMA page_count", 0, "sizing the new session") *
                             db.query_int("PRAGMA page_size", 0, "sizing the new session");
        struct stat st {};
        const int64_t have = ::stat(tmp.c_str(), &st) == 0 ? int64_t(st.st_size) : -1;
        if (rc != SQLITE_OK || log != done || have < want) {
            const int sys = sqlite3_system_errno(db.handle());
            throw SessionError(SessionErrorKind::IO,
                               str("writing its ", want, " bytes of tables stopped at ", have, " bytes (",
                                   rc != SQLITE_OK ? sqlite3_errmsg(db.handle()) : "disk full?",
                                   sys ? str(": ", std::strerror(sys)) : std::string(), ")"),
                               "free disk space or choose another directory");
        }
    } catch (const SessionError& e) {
        ::unlink(tmp.c_str());
        ::unlink((tmp + "-wal").c_str());
        ::unlink((tmp + "-shm").c_str());
        throw SessionError(e.kind(), str("cannot create session '", path, "': ", e.what()), e.hint());
    } catch (...) {
        ::unlink(tmp.c_str());
        ::unlink((tmp + "-wal").c_str());
        ::unlink((tmp + "-shm").c_str());
        throw;
    }
}

// Puts `tmp` at `path` unless something is there already (then false). Never replaces a file:
// link() fails with EEXIST atomically; renameat2(RENAME_NOREPLACE) covers file systems
// without hard links.
bool place_new_file(const std::string& tmp, const std::string& path) {
    if (::link(tmp.c_str(), path.c_str()) == 0) {
        ::unlink(tmp.c_str());
        return true;
    }
    int e = errno;
    if (e != EEXIST && renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) == 0) return true;
    if (e != EEXIST) e = errno;
    ::unlink(tmp.c_str());
    if (e == EEXIST) return false;
    throw SessionError(SessionErrorKind::NOT_WRITABLE,
                       str("cannot create session '", path, "': ", std::strerror(e)), "choose a writable directory");
}

std::string temp_name(const std::string& path) {
    static std::atomic<uint64_t> counter{0};
    return str(dir_of(path), "/.", base_of(path), ".creating-", getpid(), "-", counter.fetch_add(1));
}

// An empty file, or an SQLite file without a single table: what a creator killed between
// creating the file and committing the schema leaves (kvlab before atomic creation). It holds
// nothing, so replacing it loses nothing.
bool is_half_created(const std::string& path) {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
    if (st.st_size == 0) return true;
    if (st.st_size < 100) return false;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char head[16] = {0};
    const bool sqlite = ::read(fd, head, 16) == 16 && std::memcmp(head, "SQLite format 3", 16) == 0;
    ::close(fd);
    if (!sqlite) return false;
    try {
        Db db(path, SQLITE_OPEN_READONLY);
        return db.query_int("SELECT count(*) FROM sqlite_schema", 1, "counting the tables") == 0;
    } catch (const std::exception&) {
        return false;
    }
}
}  // namespace

std::unique_ptr<Db> create_session_db(const std::string& path) {
    const std::string dir = dir_of(path);
    struct stat st {};
    if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        throw SessionError(SessionErrorKind::NOT_FOUND,
                           str("cannot create session '", path, "': directory '", dir, "' does not exist"));
    auto exists = [&] {
        return SessionError(SessionErrorKind::INVALID, str("cannot create session '", path, "': the file already exists"),
                            "open it instead, or choose a new name");
    };
    if (session_file_exists(path)) throw exists();
    // Built whole under a temporary name, then linked into place: a concurrent creator or a
    // reader never sees a file without its schema, and a kill leaves only the temporary file.
    const std::string tmp = temp_name(path);
    build_session_file(tmp, path, dir);
    if (!place_new_file(tmp, path)) throw exists();
    return open_session_db(path, OpenMode::READ_WRITE, /*writer=*/true);
}

bool repair_half_created_session(const std::string& path) {
    if (!is_half_created(path)) return false;
    // Lock the broken file so two repairers cannot both replace it (the second would replace the
    // first one's fresh session); re-check under the lock that it is still the broken file.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool repaired = false;
    if (flock(fd, LOCK_EX) == 0) {
        struct stat a {}, b {};
        if (fstat(fd, &a) == 0 && stat(path.c_str(), &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev &&
            is_half_created(path)) {
            const std::string tmp = temp_name(path);
            build_session_file(tmp, path, dir_of(path));
            ::unlink((path + "-wal").c_str());
            ::unlink((path + "-shm").c_str());
            // rename() replaces the broken file in one step; readers see old or new, never none.
            if (::rename(tmp.c_str(), path.c_str()) != 0) {
                int e = errno;
                ::unlink(tmp.c_str());
                ::close(fd);
                throw SessionError(SessionErrorKind::NOT_WRITABLE,
                                   str("cannot repair the half-created session '", path, "': ", std::strerror(e)));
            }
            repaired = true;
        }
    }
    ::close(fd);
    return repaired;
}

}  // namespace kv::storage
