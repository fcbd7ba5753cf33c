// The runs table model without any widget or display: QAbstractItemModelTester watches every
// change while rows are merged, updated live and removed; decoding of config/summary JSON and
// the sort role are checked against the values written into the RunInfo.
#include <QAbstractItemModelTester>
#include <QSignalSpy>
#include <QSortFilterProxyModel>
#include <QtTest>

#include <cmath>

#include "models/runs_model.h"

using kv::gui::RunRow;
using kv::gui::RunsModel;
using kv::storage::RunInfo;
using kv::storage::RunStatus;

namespace {
RunInfo info(int64_t id, const std::string& cache, int64_t L, RunStatus st, const std::string& summary = "{}") {
    RunInfo r;
    r.id = id;
    r.name = "run " + std::to_string(id);
    r.config = R"({"mode":"eval_long","kv_cache":{"name":")" + cache + R"(","cache_length":)" + std::to_string(L) +
               R"(,"chunk_size":32}})";
    r.status = st;
    r.summary = summary;
    return r;
}
}  // namespace

class RunsModelTest : public QObject {
    Q_OBJECT
   private Q_SLOTS:
    void decodesConfigAndSummary() {
        RunInfo i = info(3, "h2o-orig-q8", 256, RunStatus::DONE,
                         R"({"mean_loss":1.25,"accuracy":0.5,"tokens_per_s":1234.4,"memory":{"cpu":{"peak_total":4096}},)"
                         R"("peak_bytes":{"cpu":1000}})");
        RunRow r = kv::gui::runRowFromInfo(i);
        QCOMPARE(r.policy, QString("h2o-orig"));
        QCOMPARE(r.buffer, QString("q8"));
        QCOMPARE(r.mode, QString("eval_long"));
        QCOMPARE(r.cacheLength, int64_t(256));
        QCOMPARE(r.chunkSize, int64_t(32));
        QCOMPARE(r.loss, 1.25);
        QCOMPARE(r.accuracy, 0.5);
        QCOMPARE(r.peakBytes, int64_t(4096));  // a phase peak above the events' (dropped events) raises it
        // Malformed JSON never throws; fields stay unset.
        RunInfo bad = info(4, "dense-default", 0, RunStatus::FAILED, "{not json");
        bad.config = "[1,2";
        RunRow b = kv::gui::runRowFromInfo(bad);
        QVERIFY(std::isnan(b.loss));
        QCOMPARE(b.peakBytes, int64_t(-1));
        QCOMPARE(b.cacheLength, int64_t(-1));
    }

    void aliasesShowTheirCanonicalPolicyAndBuffer() {
        // A session written before names were stored canonically holds keys_values' alias: the
        // table shows the same policy and buffer as for a run stored as "h2o-q8" (issue 36).
        RunsModel model;
        model.setRuns({kv::gui::runRowFromInfo(info(1, "h2o-torch-quantized8", 64, RunStatus::DONE)),
                       kv::gui::runRowFromInfo(info(2, "h2o-orig-torch-quantized4", 64, RunStatus::DONE)),
                       kv::gui::runRowFromInfo(info(3, "h2o-q8", 64, RunStatus::DONE))});
        const QString want[4][2] = {{}, {"h2o", "q8"}, {"h2o-orig", "q4"}, {"h2o", "q8"}};  // by run id
        QCOMPARE(model.rowCount(), 3);
        for (int row = 0; row < 3; ++row) {
            const int64_t id = model.rows()[size_t(row)].id;
            QCOMPARE(model.data(model.index(row, RunsModel::COLUMN_POLICY)).toString(), want[id][0]);
            QCOMPARE(model.data(model.index(row, RunsModel::COLUMN_BUFFER)).toString(), want[id][1]);
        }
    }

    void ranksColumnShowsDataParallelRanks() {
        // config dist.ranks (issue 23); a one-process run (no dist block) shows 1.
        RunsModel model;
        RunInfo dp = info(1, "h2o-default", 64, RunStatus::DONE);
        dp.config = R"({"mode":"finetune_long_lora","dist":{"backend":"mpi","ranks":4}})";
        model.setRuns({kv::gui::runRowFromInfo(dp), kv::gui::runRowFromInfo(info(2, "h2o-default", 64, RunStatus::DONE))});
        QCOMPARE(model.headerData(RunsModel::COLUMN_RANKS, Qt::Horizontal).toString(), QString("ranks"));
        QCOMPARE(model.data(model.index(0, RunsModel::COLUMN_RANKS)).toString(), QString("4"));
        QCOMPARE(model.data(model.index(0, RunsModel::COLUMN_RANKS), RunsModel::SortRole).toLongLong(), 4LL);
        QCOMPARE(model.data(model.index(1, RunsModel::COLUMN_RANKS)).toString(), QString("1"));
    }

    void taskAndTokensColumnsTellRunsApart() {
        // Two runs of one policy and cache length differ in task and sequence length: the table
        // shows both (issue 37); a config without them shows "-".
        RunsModel model;
        RunInfo a = info(1, "h2o-default", 256, RunStatus::DONE), b = info(2, "h2o-default", 256, RunStatus::DONE);
        a.config = R"({"mode":"eval_long","data":{"name":"repeat","seq_length":1024},"kv_cache":{"name":"h2o-default","cache_length":256}})";
        b.config = R"({"mode":"eval_long","data":{"name":"text","seq_length":4096},"kv_cache":{"name":"h2o-default","cache_length":256}})";
        model.setRuns({kv::gui::runRowFromInfo(a), kv::gui::runRowFromInfo(b), kv::gui::runRowFromInfo(info(3, "h2o-default", 64, RunStatus::DONE))});
        QCOMPARE(model.headerData(RunsModel::COLUMN_TASK, Qt::Horizontal).toString(), QString("task"));
        QCOMPARE(model.headerData(RunsModel::COLUMN_TOKENS, Qt::Horizontal).toString(), QString("tokens"));
        QCOMPARE(model.data(model.index(0, RunsModel::COLUMN_TASK)).toString(), QString("repeat"));
        QCOMPARE(model.data(model.index(1, RunsModel::COLUMN_TASK)).toString(), QString("text"));
        QCOMPARE(model.data(model.index(0, RunsModel::COLUMN_TOKENS)).toString(), QString("1024"));
        QCOMPARE(model.data(model.index(1, RunsModel::COLUMN_TOKENS), RunsModel::SortRole).toLongLong(), 4096LL);
        QCOMPARE(model.data(model.index(2, RunsModel::COLUMN_TOKENS)).toString(), QString("-"));
    }

    void stoppedRunsSayHowTheyStopped() {
        // A cancelled run with every token of its current sample done (the issue's "100%
        // (8191/8191 tok)") reads as cancelled, never as a complete or stuck bar.
        RunsModel model;
        RunInfo c = info(1, "h2o-default", 64, RunStatus::CANCELLED);
        c.progress.tokens_done = 8191, c.progress.tokens_total = 8192;
        RunInfo f = info(2, "h2o-default", 64, RunStatus::FAILED);
        f.progress.chunks_done = 3, f.progress.chunks_total = 4;
        RunInfo r = info(3, "h2o-default", 64, RunStatus::RUNNING);
        r.progress.tokens_done = 77, r.progress.tokens_total = 100;
        std::vector<RunRow> rows;
        for (const auto& i : {c, f, r}) rows.push_back(kv::gui::runRowFromInfo(i));
        model.setRuns(rows);
        auto text = [&](int row) { return model.data(model.index(row, RunsModel::COLUMN_PROGRESS)).toString(); };
        QCOMPARE(text(0), QString("cancelled at 99%"));
        QCOMPARE(text(1), QString("failed at 75%"));
        QCOMPARE(text(2), QString("77%"));
        QCOMPARE(kv::gui::progressText(RunStatus::CRASHED, -1), QString("crashed"));
        QCOMPARE(kv::gui::progressText(RunStatus::QUEUED, -1), QString("-"));
        // The time left: 100 s in at a quarter done leaves 300 s; a run just started, under 2%
        // done or not running has none.
        RunRow live;
        live.status = RunStatus::RUNNING;
        live.startedMs = 1'000'000;
        live.done = 25, live.total = 100;
        QCOMPARE(kv::gui::runSecondsLeft(live, 1'100'000), 300.0);
        QCOMPARE(kv::gui::progressText(RunStatus::RUNNING, 0.25, 300.0), QString::fromUtf8("25% \u00b7 5 min 0 s left"));
        QCOMPARE(kv::gui::progressText(RunStatus::RUNNING, 0.9, 12.4), QString::fromUtf8("90% \u00b7 12 s left"));
        QCOMPARE(kv::gui::runSecondsLeft(live, 1'001'000), -1.0);
        live.done = 1;
        QCOMPARE(kv::gui::runSecondsLeft(live, 1'100'000), -1.0);
        live.done = 25, live.status = RunStatus::DONE;
        QCOMPARE(kv::gui::runSecondsLeft(live, 1'100'000), -1.0);
        QCOMPARE(kv::gui::progressText(RunStatus::CANCELLED, 0.5, 10.0), QString("cancelled at 50%"));
    }

    void mergesUnderModelTester() {
        RunsModel model;
        QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
        QSortFilterProxyModel proxy;
        proxy.setSourceModel(&model);
        proxy.setSortRole(RunsModel::SortRole);
        proxy.sort(RunsModel::COLUMN_PEAK_MEMORY, Qt::DescendingOrder);
        QAbstractItemModelTester proxyTester(&proxy, QAbstractItemModelTester::FailureReportingMode::QtTest);

        auto rows = [](std::initializer_list<RunInfo> infos) {
            std::vector<RunRow> out;
            for (const auto& i : infos) out.push_back(kv::gui::runRowFromInfo(i));
            return out;
        };
        model.setRuns(rows({info(2, "h2o-default", 64, RunStatus::RUNNING), info(1, "dense-default", 0, RunStatus::DONE,
                                                                                  R"({"memory":{"cpu":{"peak_total":900}}})")}));
        QCOMPARE(model.rowCount(), 2);
        QCOMPARE(model.data(model.index(0, RunsModel::COLUMN_ID)).toLongLong(), 1LL);  // ascending ids
        QCOMPARE(model.data(model.index(0, RunsModel::COLUMN_CACHE_LENGTH)).toString(), QString("all"));
        QCOMPARE(model.activeRuns(), 1);

        // Live progress from events survives a database merge while the run is active.
        QSignalSpy changed(&model, &QAbstractItemModel::dataChanged);
        model.setProgress(2, 5, 20, "tokens");
        QCOMPARE(changed.count(), 1);
        QCOMPARE(model.data(model.index(1, RunsModel::COLUMN_PROGRESS), RunsModel::ProgressRole).toDouble(), 0.25);
        model.setRuns(rows({info(1, "dense-default", 0, RunStatus::DONE, R"({"memory":{"cpu":{"peak_total":900}}})"),
                            info(2, "h2o-default", 64, RunStatus::RUNNING), info(5, "lastrec-q4", 128, RunStatus::QUEUED)}));
        QCOMPARE(model.rowCount(), 3);
        QCOMPARE(model.data(model.index(1, RunsModel::COLUMN_PROGRESS)).toString(), QString("25%"));
        QCOMPARE(model.activeRuns(), 2);

        // Final status from the run manager, then the database's final row replaces live progress.
        model.setStatus(2, RunStatus::DONE, "");
        model.setRuns(rows({info(1, "dense-default", 0, RunStatus::DONE, R"({"memory":{"cpu":{"peak_total":900}}})"),
                            info(2, "h2o-default", 64, RunStatus::DONE, R"({"memory":{"cpu":{"peak_total":2000}}})"),
                            info(5, "lastrec-q4", 128, RunStatus::QUEUED)}));
        QCOMPARE(model.data(model.index(1, RunsModel::COLUMN_PROGRESS)).toString(), QString("100%"));
        QCOMPARE(model.data(model.index(1, RunsModel::COLUMN_PEAK_MEMORY)).toString(), QString("1.95 KiB"));

        // The one peak (issue 16): the whole run's allocator peak from the events ("peak_bytes"),
        // not the evaluation phase's own peak ("memory"), which excludes model loading.
        QCOMPARE(kv::gui::runRowFromInfo(info(7, "h2o-default", 64, RunStatus::DONE,
                                              R"({"memory":{"cpu":{"peak_total":900}},"peak_bytes":{"cpu":3000}})"))
                     .peakBytes,
                 int64_t(3000));

        // Sorting by the numeric role: peak memory descending puts run 2 (2000 B) first.
        QCOMPARE(proxy.data(proxy.index(0, RunsModel::COLUMN_ID)).toLongLong(), 2LL);

        // Rows that vanished from the database are removed; unknown ids are ignored.
        model.setRuns(rows({info(5, "lastrec-q4", 128, RunStatus::CANCELLED)}));
        QCOMPARE(model.rowCount(), 1);
        model.setProgress(99, 1, 2, "tokens");
        model.setStatus(99, RunStatus::DONE, "");
        QCOMPARE(model.rowOfRun(5), 0);
        QCOMPARE(model.rowOfRun(1), -1);
        QCOMPARE(model.activeRuns(), 0);
        model.clear();
        QCOMPARE(model.rowCount(), 0);
    }

    // Degraded, failed and crashed runs carry the warning (the browser draws it as an icon) and
    // their reason as the tooltip; done and running runs do not.
    void untrustedRunsCarryTheWarning() {
        RunsModel model;
        std::vector<RunRow> rows;
        for (auto [id, st] : {std::pair{1, RunStatus::DONE}, {2, RunStatus::DEGRADED}, {3, RunStatus::FAILED},
                              {4, RunStatus::CRASHED}, {5, RunStatus::RUNNING}}) {
            RunInfo i = info(id, "h2o-default", 64, st);
            if (st != RunStatus::DONE && st != RunStatus::RUNNING) i.error = "disk full: 720 telemetry events lost";
            rows.push_back(kv::gui::runRowFromInfo(i));
        }
        model.setRuns(rows);
        const bool expected[] = {false, true, true, true, false};
        for (int row = 0; row < 5; ++row) {
            const QModelIndex st = model.index(row, RunsModel::COLUMN_STATUS);
            QCOMPARE(model.data(st, RunsModel::WarningRole).toBool(), expected[row]);
            if (expected[row]) QCOMPARE(model.data(st, Qt::ToolTipRole).toString(), QString("disk full: 720 telemetry events lost"));
        }
    }

    void scoreIsTheTasksOwnNumber() {
        // The first the summary records of: copied tokens, answer tokens right, accuracy, perplexity.
        struct Case {
            const char* summary;
            double score;
            const char* name;
        } cases[] = {
            {R"({"copy_token_accuracy":0.75,"accuracy":0.2,"perplexity":9})", 0.75, "copied tokens"},
            {R"({"answer_token_accuracy":0.5,"accuracy":0.1})", 0.5, "answer tokens right"},
            {R"({"accuracy":0.25,"perplexity":12})", 0.25, "accuracy"},
            {R"({"perplexity":12.5})", 12.5, "perplexity"},
        };
        RunsModel model;
        std::vector<RunRow> rows;
        for (size_t k = 0; k < std::size(cases); ++k) rows.push_back(kv::gui::runRowFromInfo(info(int64_t(k + 1), "h2o-default", 64, RunStatus::DONE, cases[k].summary)));
        model.setRuns(rows);
        for (int k = 0; k < int(std::size(cases)); ++k) {
            const QModelIndex i = model.index(k, RunsModel::COLUMN_SCORE);
            QCOMPARE(model.data(i, RunsModel::SortRole).toDouble(), cases[k].score);
            QCOMPARE(model.data(i, Qt::ToolTipRole).toString(), QString(cases[k].name));
        }
        // No score and no fidelity: "-", sorted below every number.
        RunRow none = kv::gui::runRowFromInfo(info(9, "h2o-default", 64, RunStatus::DONE, R"({"mean_loss":2})"));
        QVERIFY(std::isnan(none.score));
        QVERIFY(none.scoreName.isEmpty());
        RunRow fid = kv::gui::runRowFromInfo(
            info(10, "h2o-default", 64, RunStatus::DONE, R"({"fidelity_next_token_kl":0.125,"fidelity_kept_mass":0.875})"));
        model.setRuns({none, fid});
        QCOMPARE(model.data(model.index(0, RunsModel::COLUMN_SCORE)).toString(), QString("-"));
        QCOMPARE(model.data(model.index(0, RunsModel::COLUMN_FIDELITY_KL)).toString(), QString("-"));
        QCOMPARE(model.data(model.index(1, RunsModel::COLUMN_FIDELITY_KL)).toString(), QString("0.125"));
        QCOMPARE(model.data(model.index(1, RunsModel::COLUMN_KEPT_MASS), RunsModel::SortRole).toDouble(), 0.875);
    }

    void everySummaryNumberHasAColumn() {
        RunsModel model;
        QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
        model.setRuns({kv::gui::runRowFromInfo(info(1, "h2o-default", 64, RunStatus::DONE, R"({"seconds":2.5,"peak_bytes":{"cpu":1000},"mode":"eval_long","flag":true})"))});
        // Numbers only (text and booleans are no metric), nested ones by dotted path.
        QCOMPARE(model.metricNames(), (std::vector<QString>{"peak_bytes.cpu", "seconds"}));
        QCOMPARE(model.columnCount(), int(RunsModel::NUM_COLUMNS) + 2);
        QCOMPARE(model.headerData(RunsModel::NUM_COLUMNS + 1, Qt::Horizontal).toString(), QString("seconds"));
        QCOMPARE(model.data(model.index(0, RunsModel::NUM_COLUMNS + 1)).toString(), QString("2.5"));
        // A second run with a new number appends its column; the first run has none there.
        model.setRuns({kv::gui::runRowFromInfo(info(1, "h2o-default", 64, RunStatus::DONE, R"({"seconds":2.5,"peak_bytes":{"cpu":1000}})")),
                       kv::gui::runRowFromInfo(info(2, "h2o-default", 64, RunStatus::DONE, R"({"copy_token_accuracy":0.5})"))});
        QCOMPARE(model.columnCount(), int(RunsModel::NUM_COLUMNS) + 3);
        QCOMPARE(model.headerData(RunsModel::NUM_COLUMNS + 2, Qt::Horizontal).toString(), QString("copy_token_accuracy"));
        QCOMPARE(model.data(model.index(0, RunsModel::NUM_COLUMNS + 2)).toString(), QString("-"));
        QCOMPARE(model.data(model.index(1, RunsModel::NUM_COLUMNS + 2)).toString(), QString("0.5"));
        model.clear();
        QCOMPARE(model.columnCount(), int(RunsModel::NUM_COLUMNS));
    }

    void defaultNamesAreMadeUnique() {
        QCOMPARE(kv::gui::uniqueRunName("h2o L=64", {}), QString("h2o L=64"));
        QCOMPARE(kv::gui::uniqueRunName("h2o L=64", {"h2o L=64"}), QString("h2o L=64 #2"));
        QCOMPARE(kv::gui::uniqueRunName("h2o L=64", {"h2o L=64", "h2o L=64 #2", "h2o L=64 #4"}), QString("h2o L=64 #3"));
        QCOMPARE(kv::gui::uniqueRunName("h2o", {"h2o L=64"}), QString("h2o"));
    }

    void nameAndNotesEditsAreRequestedNotApplied() {
        // The model asks its owner to store an edit; the row changes when the stored value returns.
        RunsModel model;
        model.setRuns({kv::gui::runRowFromInfo(info(7, "h2o-default", 64, RunStatus::DONE))});
        QSignalSpy spy(&model, &RunsModel::editRequested);
        QVERIFY(model.flags(model.index(0, RunsModel::COLUMN_NAME)) & Qt::ItemIsEditable);
        QVERIFY(model.flags(model.index(0, RunsModel::COLUMN_NOTES)) & Qt::ItemIsEditable);
        QVERIFY(!(model.flags(model.index(0, RunsModel::COLUMN_POLICY)) & Qt::ItemIsEditable));
        QVERIFY(model.setData(model.index(0, RunsModel::COLUMN_NAME), "  baseline  "));
        QVERIFY(model.setData(model.index(0, RunsModel::COLUMN_NOTES), "first try"));
        QVERIFY(!model.setData(model.index(0, RunsModel::COLUMN_POLICY), "lastrec"));
        QVERIFY(!model.setData(model.index(0, RunsModel::COLUMN_NAME), "run 7"));  // unchanged: nothing to store
        QCOMPARE(spy.count(), 2);
        QCOMPARE(spy[0][0].toLongLong(), 7LL);
        QCOMPARE(spy[0][1].toInt(), int(RunsModel::COLUMN_NAME));
        QCOMPARE(spy[0][2].toString(), QString("baseline"));
        QCOMPARE(spy[1][2].toString(), QString("first try"));
        QCOMPARE(model.rows()[0].name, QString("run 7"));
    }

    void headersCoverEveryColumn() {
        RunsModel model;
        for (int c = 0; c < RunsModel::NUM_COLUMNS; ++c)
            QVERIFY(!model.headerData(c, Qt::Horizontal).toString().isEmpty());
        QCOMPARE(model.columnCount(), int(RunsModel::NUM_COLUMNS));
    }
};

QTEST_GUILESS_MAIN(RunsModelTest)
#include "runs_model_test.moc"
