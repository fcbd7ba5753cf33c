// The sample_tokens table (see sample_tokens.h).
#include "storage/sample_tokens.h"

#include <cstring>

namespace kv::storage {

std::vector<uint8_t> encode_piece_ends(const std::vector<std::string>& pieces, std::string* bytes) {
    std::vector<uint8_t> ends(pieces.size() * 4);
    bytes->clear();
    for (size_t i = 0; i < pieces.size(); ++i) {
        bytes->append(pieces[i]);
        const uint32_t e = uint32_t(bytes->size());
        std::memcpy(ends.data() + i * 4, &e, 4);
    }
    return ends;
}

std::vector<std::string> decode_pieces(const void* bytes, size_t n, const void* ends, size_t ends_bytes) {
    std::vector<std::string> out(ends_bytes / 4);
    const char* b = static_cast<const char*>(bytes);
    uint32_t prev = 0;
    for (size_t i = 0; i < out.size(); ++i) {
        uint32_t e = 0;
        std::memcpy(&e, static_cast<const uint8_t*>(ends) + i * 4, 4);
        if (e < prev || e > n)
            throw SessionError(SessionErrorKind::DAMAGED,
                               str("sample_tokens: piece ", i, " ends at byte ", e, ", outside ", prev, "..", n,
                                   " (piece_ends must rise within the pieces blob)"));
        out[i].assign(b + prev, e - prev);
        prev = e;
    }
    return out;
}

void insert_sample_tokens(Db& db, int64_t run, const SampleTokensRow& r) {
    const size_t T = r.ids.size();
    if ((!r.pieces.empty() && r.pieces.size() != T) || (!r.loss.empty() && r.loss.size() != T))
        throw SessionError(SessionErrorKind::INVALID,
                           str("sample ", r.sample, ": ", r.pieces.size(), " pieces and ", r.loss.size(),
                               " losses for ", T, " token ids (expected none or one per id)"));
    std::string piece_bytes;
    const std::vector<uint8_t> ends = encode_piece_ends(r.pieces, &piece_bytes);
    Stmt s = db.prepare(
        "INSERT INTO sample_tokens(run_id, sample, description, tokens, ids, pieces, piece_ends, loss, mean_loss, "
        "scored, correct, token_accuracy) VALUES(?,?,?,?,?,?,?,?,?,?,?,?)");
    s.bind(1, run).bind(2, r.sample).bind(3, std::string_view(r.description)).bind(4, int64_t(T));
    s.bind_blob(5, r.ids.data(), T * 4);
    // An empty piece list is stored as NULL (not an empty blob) so readers can tell "no text".
    if (r.pieces.empty()) s.bind_null(6).bind_null(7);
    else s.bind_blob(6, piece_bytes.data(), piece_bytes.size()).bind_blob(7, ends.data(), ends.size());
    if (r.loss.empty()) s.bind_null(8);
    else s.bind_blob(8, r.loss.data(), T * 4);
    if (r.mean_loss == r.mean_loss) s.bind(9, r.mean_loss);
    else s.bind_null(9);
    s.bind(10, r.scored).bind(11, int(r.correct)).bind(12, r.token_accuracy);
    s.run();
}

std::vector<SampleTokensRow> select_sample_tokens(Db& db, int64_t run, int64_t after_id, bool with_pieces) {
    Stmt s = db.prepare(
        "SELECT id, sample, description, tokens, ids, pieces, piece_ends, loss, mean_loss, scored, correct, "
        "token_accuracy FROM sample_tokens WHERE run_id = ? AND id > ? ORDER BY id");
    s.bind(1, run).bind(2, after_id);
    std::vector<SampleTokensRow> out;
    while (s.step()) {
        SampleTokensRow r;
        r.id = s.i64(0);
        r.sample = s.i64(1);
        r.description = s.text(2);
        const int64_t T = s.i64(3);
        auto floats_or_ints = [&](int col, auto& v, const char* what) {
            const void* p = s.blob(col);
            const size_t n = s.bytes(col);
            if (n == 0) return;
            if (n != size_t(T) * 4)
                throw SessionError(SessionErrorKind::DAMAGED, str("sample_tokens row ", r.id, ": ", what, " holds ", n,
                                                                  " bytes for ", T, " tokens (expected ", T * 4, ")"));
            v.resize(size_t(T));
            std::memcpy(v.data(), p, n);
        };
        floats_or_ints(4, r.ids, "ids");
        if (with_pieces && !s.is_null(6)) {
            const void* bytes = s.blob(5);
            const size_t nbytes = s.bytes(5);
            const void* ends = s.blob(6);
            const size_t nends = s.bytes(6);
            if (nends != size_t(T) * 4)
                throw SessionError(SessionErrorKind::DAMAGED, str("sample_tokens row ", r.id, ": piece_ends holds ",
                                                                  nends, " bytes for ", T, " tokens"));
            r.pieces = decode_pieces(bytes, nbytes, ends, nends);
        }
        floats_or_ints(7, r.loss, "loss");
        if (!s.is_null(8)) r.mean_loss = s.f64(8);
        r.scored = s.i64(9);
        r.correct = s.i32(10);
        r.token_accuracy = s.f64(11);
        out.push_back(std::move(r));
    }
    return out;
}

}  // namespace kv::storage
