// The sample_tokens table (schema v4): every field of a sample round-trips through a session
// (ids, pieces with bytes that are not UTF-8 or are NUL, NaN losses); its columns are the ones
// docs/SESSIONS.md lists (PRAGMA table_xinfo); a version-3 file gains the table on its first
// read-write open; bad lengths and damaged offsets are named errors.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cmath>
#include <limits>
#include <random>
#include <sstream>

#include "storage/exports.h"
#include "storage/sample_tokens.h"
#include "storage/schema.h"
#include "storage/session.h"
#include "storage/session_reader.h"
#include "storage_test_util.h"

namespace kv {
namespace {

using storage::SampleTokensRow;

SampleTokensRow make_row(int64_t sample, size_t T, uint64_t seed) {
    std::mt19937_64 rng(seed);
    SampleTokensRow r;
    r.sample = sample;
    r.description = "sample " + std::to_string(sample) + " \xe2\x80\x94 passkey at depth 0.5";
    for (size_t t = 0; t < T; ++t) {
        r.ids.push_back(int32_t(rng() % 49152));
        std::string piece;
        const size_t n = rng() % 5;  // empty pieces too
        for (size_t i = 0; i < n; ++i) piece.push_back(char(rng() % 256));  // any byte, NUL and invalid UTF-8 included
        r.pieces.push_back(piece);
        r.loss.push_back(t % 3 == 0 ? std::numeric_limits<float>::quiet_NaN() : float(rng() % 1000) / 97.0f);
    }
    r.mean_loss = 2.5;
    r.scored = int64_t(T - (T + 2) / 3);
    r.correct = sample % 2 ? 1 : 0;
    r.token_accuracy = 0.75;
    return r;
}

void expect_same(const SampleTokensRow& got, const SampleTokensRow& want) {
    EXPECT_EQ(got.sample, want.sample);
    EXPECT_EQ(got.description, want.description);
    EXPECT_EQ(got.ids, want.ids);
    EXPECT_EQ(got.pieces, want.pieces);
    ASSERT_EQ(got.loss.size(), want.loss.size());
    for (size_t t = 0; t < want.loss.size(); ++t) {
        if (std::isnan(want.loss[t])) EXPECT_TRUE(std::isnan(got.loss[t])) << t;
        else EXPECT_EQ(got.loss[t], want.loss[t]) << t;  // bit-exact: a float32 blob
    }
    EXPECT_EQ(got.mean_loss, want.mean_loss);
    EXPECT_EQ(got.scored, want.scored);
    EXPECT_EQ(got.correct, want.correct);
    EXPECT_EQ(got.token_accuracy, want.token_accuracy);
}

TEST(SampleTokens, EveryFieldRoundTripsThroughASession) {
    test::ScratchDir dir;
    const std::string path = dir.file("t.kvlab");
    auto s = storage::Session::create(path);
    const int64_t a = s->create_run("a"), b = s->create_run("b");
    std::vector<SampleTokensRow> rows = {make_row(0, 300, 1), make_row(1, 7, 2), make_row(2, 0, 3)};
    for (const auto& r : rows) s->write_sample_tokens(a, r);
    SampleTokensRow textless = make_row(0, 40, 4);
    textless.pieces.clear();
    textless.mean_loss = std::numeric_limits<double>::quiet_NaN();
    s->write_sample_tokens(b, textless);
    storage::SessionReader reader(path);
    const auto got = reader.sample_tokens(a);
    ASSERT_EQ(got.size(), rows.size());
    for (size_t i = 0; i < rows.size(); ++i) expect_same(got[i], rows[i]);
    // The id cursor: only newer rows.
    EXPECT_EQ(reader.sample_tokens(a, got[1].id).size(), 1u);
    const auto other = reader.sample_tokens(b);
    ASSERT_EQ(other.size(), 1u);
    EXPECT_TRUE(other[0].pieces.empty());
    EXPECT_TRUE(std::isnan(other[0].mean_loss));
    EXPECT_EQ(other[0].ids, textless.ids);
    // Without pieces: the same ids and losses.
    const auto lean = reader.sample_tokens(a, 0, false);
    EXPECT_TRUE(lean[0].pieces.empty());
    EXPECT_EQ(lean[0].ids, rows[0].ids);
}

TEST(SampleTokens, TheCsvExportHasOneRowPerPosition) {
    test::ScratchDir dir;
    const std::string path = dir.file("e.kvlab");
    auto s = storage::Session::create(path);
    const int64_t run = s->create_run("e");
    SampleTokensRow r;
    r.sample = 0;
    r.ids = {5, 6, 7};
    r.pieces = {"a", "b,c", "\n"};
    r.loss = {std::numeric_limits<float>::quiet_NaN(), 1.5f, 0.25f};
    s->write_sample_tokens(run, r);
    storage::SessionReader reader(path);
    std::ostringstream out;
    EXPECT_EQ(storage::export_tokens_csv(reader, run, out), 3u);
    EXPECT_EQ(out.str(), "sample,position,token_id,piece,loss\n0,0,5,a,\n0,1,6,\"b,c\",1.5\n0,2,7,\"\n\",0.25\n");
    try {
        storage::export_run(reader, run, storage::ExportWhat::TOKENS, storage::ExportFormat::CHROME_TRACE, dir.file("t.json"));
        ADD_FAILURE() << "tokens as a chrome trace accepted";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("expected --format csv"), std::string::npos) << e.what();
    }
}

TEST(SampleTokens, ColumnsAreTheDocumentedOnes) {
    test::ScratchDir dir;
    const std::string path = dir.file("c.kvlab");
    storage::Session::create(path);
    storage::Db db(path, SQLITE_OPEN_READONLY);
    // docs/SESSIONS.md, table sample_tokens.
    const std::vector<std::pair<std::string, std::string>> want = {
        {"id", "INTEGER"},       {"run_id", "INTEGER"}, {"sample", "INTEGER"},    {"description", "TEXT"},
        {"tokens", "INTEGER"},   {"ids", "BLOB"},       {"pieces", "BLOB"},       {"piece_ends", "BLOB"},
        {"loss", "BLOB"},        {"mean_loss", "REAL"}, {"scored", "INTEGER"},    {"correct", "INTEGER"},
        {"token_accuracy", "REAL"}};
    std::vector<std::pair<std::string, std::string>> got;
    storage::Stmt s = db.prepare("SELECT name, type FROM pragma_table_xinfo('sample_tokens') ORDER BY cid");
    while (s.step()) got.emplace_back(s.text(0), s.text(1));
    EXPECT_EQ(got, want);
    EXPECT_EQ(db.query_int("SELECT count(*) FROM sqlite_schema WHERE type='index' AND name='sample_tokens_run'", 0, "t"), 1);
    EXPECT_EQ(db.query_int("PRAGMA user_version", 0, "t"), 5);  // version 5 added run_notes
}

TEST(SampleTokens, AVersion3FileGainsTheTableOnItsFirstReadWriteOpen) {
    test::ScratchDir dir;
    const std::string path = dir.file("v3.kvlab");
    int64_t run = 0;
    {
        auto s = storage::Session::create(path);
        run = s->create_run("before the upgrade");
    }
    {  // what kvlab 3 wrote: no sample_tokens table
        storage::Db db(path, SQLITE_OPEN_READWRITE);
        db.exec("DROP TABLE sample_tokens; PRAGMA user_version=3; UPDATE meta SET value='3' WHERE key='schema_version';", "t");
    }
    try {
        storage::SessionReader old(path);
        ADD_FAILURE() << "a read-only open of a schema-3 file must ask for the upgrade";
    } catch (const storage::SessionError& e) {
        EXPECT_NE(std::string(e.what()).find("schema version 3"), std::string::npos) << e.what();
    }
    auto s = storage::Session::open(path);  // migrates 3 -> 4
    EXPECT_EQ(s->run(run).name, "before the upgrade");
    const SampleTokensRow r = make_row(0, 12, 9);
    s->write_sample_tokens(run, r);
    EXPECT_EQ(s->integrity_check(), "ok");
    storage::SessionReader reader(path);
    const auto got = reader.sample_tokens(run);
    ASSERT_EQ(got.size(), 1u);
    expect_same(got[0], r);
    storage::Db db(path, SQLITE_OPEN_READONLY);
    EXPECT_EQ(db.query_int("PRAGMA user_version", 0, "t"), storage::kSchemaVersion);
}

TEST(SampleTokens, BadLengthsAndDamagedOffsetsAreNamed) {
    test::ScratchDir dir;
    const std::string path = dir.file("bad.kvlab");
    auto s = storage::Session::create(path);
    const int64_t run = s->create_run("r");
    SampleTokensRow r = make_row(0, 10, 5);
    r.loss.pop_back();
    try {
        s->write_sample_tokens(run, r);
        ADD_FAILURE() << "9 losses for 10 ids accepted";
    } catch (const storage::SessionError& e) {
        EXPECT_NE(std::string(e.what()).find("9 losses for 10 token ids"), std::string::npos) << e.what();
    }
    s->write_sample_tokens(run, make_row(0, 10, 5));
    {  // piece_ends pointing past the pieces
        storage::Db db(path, SQLITE_OPEN_READWRITE);
        db.exec("UPDATE sample_tokens SET pieces = x'41'", "t");
    }
    storage::SessionReader reader(path);
    try {
        reader.sample_tokens(run);
        ADD_FAILURE() << "damaged piece offsets accepted";
    } catch (const storage::SessionError& e) {
        EXPECT_EQ(e.kind(), storage::SessionErrorKind::DAMAGED);
        EXPECT_NE(std::string(e.what()).find("piece_ends"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace kv
