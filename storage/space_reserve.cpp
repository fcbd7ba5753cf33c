// The reserve VFS (see space_reserve.h): a pass-through shim over SQLite's default VFS whose
// xWrite checks the room left before anything is written.
#include "storage/space_reserve.h"

#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/statvfs.h>

#include <climits>
#include <mutex>
#include <utility>

namespace kv::storage {

namespace {

thread_local int64_t t_keep_free = 0;
thread_local bool t_refused = false;

struct ReserveFile {
    sqlite3_file base;
    sqlite3_file* real;  // the default VFS's file, allocated right after this struct
    const char* name;    // SQLite keeps the name valid until xClose (null for temp files)
};

sqlite3_vfs* g_root = nullptr;

sqlite3_file* real_of(sqlite3_file* f) { return reinterpret_cast<ReserveFile*>(f)->real; }

int64_t free_bytes(const char* path) {
    struct statvfs s {};
    if (statvfs(path, &s) != 0) return INT64_MAX;  // cannot tell: let SQLite find out
    return int64_t(s.f_bavail) * int64_t(s.f_frsize);
}

int64_t size_limit() {
    rlimit rl{};
    if (getrlimit(RLIMIT_FSIZE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return INT64_MAX;
    return int64_t(rl.rlim_cur);
}

int x_close(sqlite3_file* f) {
    sqlite3_file* r = real_of(f);
    return r->pMethods ? r->pMethods->xClose(r) : SQLITE_OK;
}
int x_read(sqlite3_file* f, void* b, int n, sqlite3_int64 o) { return real_of(f)->pMethods->xRead(real_of(f), b, n, o); }

int x_write(sqlite3_file* f, const void* b, int n, sqlite3_int64 o) {
    sqlite3_file* r = real_of(f);
    const int64_t keep = t_keep_free;
    const char* name = reinterpret_cast<ReserveFile*>(f)->name;
    if (keep > 0 && name) {
        const int64_t end = int64_t(o) + n;
        // A file-size limit caps every offset, also inside a file already that long.
        bool refuse = end > size_limit() - keep;
        if (!refuse) {
            sqlite3_int64 size = 0;
            // Only growth takes space from the file system (overwrites reuse the file's blocks).
            if (r->pMethods->xFileSize(r, &size) == SQLITE_OK && end > size) refuse = end - size > free_bytes(name) - keep;
        }
        if (refuse) {
            t_refused = true;
            return SQLITE_FULL;
        }
    }
    return r->pMethods->xWrite(r, b, n, o);
}

int x_truncate(sqlite3_file* f, sqlite3_int64 s) { return real_of(f)->pMethods->xTruncate(real_of(f), s); }
int x_sync(sqlite3_file* f, int fl) { return real_of(f)->pMethods->xSync(real_of(f), fl); }
int x_file_size(sqlite3_file* f, sqlite3_int64* s) { return real_of(f)->pMethods->xFileSize(real_of(f), s); }
int x_lock(sqlite3_file* f, int l) { return real_of(f)->pMethods->xLock(real_of(f), l); }
int x_unlock(sqlite3_file* f, int l) { return real_of(f)->pMethods->xUnlock(real_of(f), l); }
int x_check_reserved_lock(sqlite3_file* f, int* o) { return real_of(f)->pMethods->xCheckReservedLock(real_of(f), o); }
int x_file_control(sqlite3_file* f, int op, void* a) { return real_of(f)->pMethods->xFileControl(real_of(f), op, a); }
int x_sector_size(sqlite3_file* f) { return real_of(f)->pMethods->xSectorSize(real_of(f)); }
int x_device_characteristics(sqlite3_file* f) { return real_of(f)->pMethods->xDeviceCharacteristics(real_of(f)); }
int x_shm_map(sqlite3_file* f, int pg, int sz, int ext, void volatile** p) {
    return real_of(f)->pMethods->xShmMap(real_of(f), pg, sz, ext, p);
}
int x_shm_lock(sqlite3_file* f, int o, int n, int fl) { return real_of(f)->pMethods->xShmLock(real_of(f), o, n, fl); }
void x_shm_barrier(sqlite3_file* f) { real_of(f)->pMethods->xShmBarrier(real_of(f)); }
int x_shm_unmap(sqlite3_file* f, int del) { return real_of(f)->pMethods->xShmUnmap(real_of(f), del); }
int x_fetch(sqlite3_file* f, sqlite3_int64 o, int n, void** p) { return real_of(f)->pMethods->xFetch(real_of(f), o, n, p); }
int x_unfetch(sqlite3_file* f, sqlite3_int64 o, void* p) { return real_of(f)->pMethods->xUnfetch(real_of(f), o, p); }

// Version 3 (shared memory for WAL, memory-mapped reads), like the unix VFS it wraps.
const sqlite3_io_methods kMethods = {3,           x_close,     x_read,        x_write,          x_truncate,
                                     x_sync,      x_file_size, x_lock,        x_unlock,         x_check_reserved_lock,
                                     x_file_control, x_sector_size, x_device_characteristics, x_shm_map, x_shm_lock,
                                     x_shm_barrier,  x_shm_unmap,   x_fetch,   x_unfetch};

int x_open(sqlite3_vfs*, sqlite3_filename name, sqlite3_file* f, int flags, int* out_flags) {
    auto* p = reinterpret_cast<ReserveFile*>(f);
    p->real = reinterpret_cast<sqlite3_file*>(p + 1);
    p->name = name;
    p->base.pMethods = nullptr;
    const int rc = g_root->xOpen(g_root, name, p->real, flags, out_flags);
    // SQLite calls xClose only when pMethods is set; the real file decides whether it must.
    if (p->real->pMethods) p->base.pMethods = &kMethods;
    return rc;
}

sqlite3_vfs g_vfs;

}  // namespace

const char* reserve_vfs_name() {
    static std::once_flag once;
    std::call_once(once, [] {
        sqlite3_initialize();
        g_root = sqlite3_vfs_find(nullptr);
        g_vfs = *g_root;  // every other method (delete, access, randomness, time) is the root's
        g_vfs.szOsFile = int(sizeof(ReserveFile)) + g_root->szOsFile;
        g_vfs.zName = "kvlab-reserve";
        g_vfs.pNext = nullptr;
        g_vfs.pAppData = g_root->pAppData;
        g_vfs.xOpen = x_open;
        sqlite3_vfs_register(&g_vfs, /*makeDflt=*/0);
    });
    return g_vfs.zName;
}

KeepFree::KeepFree(int64_t bytes) : saved_(t_keep_free) { t_keep_free = bytes; }
KeepFree::~KeepFree() { t_keep_free = saved_; }

bool take_reserve_refusal() { return std::exchange(t_refused, false); }

}  // namespace kv::storage
