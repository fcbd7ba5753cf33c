// BatchedInsert (see batched_insert.h). Integer columns only; the writer flushes it before every
// COMMIT, so buffered rows never outlive their transaction.
#include "batched_insert.h"

namespace kv::storage {

namespace {
std::string values_sql(int ncols, int rows) {
    std::string row = "(";
    for (int c = 0; c < ncols; ++c) row += c ? ",?" : "?";
    row += ")";
    std::string s;
    for (int r = 0; r < rows; ++r) s += (r ? "," : "") + row;
    return s;
}
}  // namespace

BatchedInsert::BatchedInsert(Db& db, const std::string& table_columns, int ncols)
    : db_(db.handle()),
      table_(table_columns.substr(0, table_columns.find('('))),
      ncols_(ncols),
      buf_(size_t(kRowsPerStatement) * size_t(ncols)),
      many_(db, "INSERT INTO " + table_columns + " VALUES" + values_sql(ncols, kRowsPerStatement)),
      one_(db, "INSERT INTO " + table_columns + " VALUES" + values_sql(ncols, 1)) {}

void BatchedInsert::flush() {
    const int n = n_;
    n_ = 0;
    if (n == 0) return;
    if (n == kRowsPerStatement) {
        sqlite3_stmt* s = many_.handle();
        for (int i = 0; i < n * ncols_; ++i) sqlite3_bind_int64(s, i + 1, buf_[size_t(i)]);
        many_.insert();
    } else {
        sqlite3_stmt* s = one_.handle();
        for (int r = 0; r < n; ++r) {
            const int64_t* row = &buf_[size_t(r) * size_t(ncols_)];
            for (int c = 0; c < ncols_; ++c) sqlite3_bind_int64(s, c + 1, row[c]);
            one_.insert();
        }
    }
    const int64_t last = sqlite3_last_insert_rowid(db_);
    if (last != next_rowid_ - 1)
        throw SessionError(SessionErrorKind::INVALID,
                           str("session writer: ", table_, " got row id ", last, " where ", next_rowid_ - 1,
                               " was expected (were rows deleted or written with explicit ids while the batch held the write lock?)"));
}

}  // namespace kv::storage
