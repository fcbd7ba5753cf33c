// Exports and build information for the app (see gui_support.h).
#include "gui_support.h"

#include <QFileInfo>
#include <QStringList>
#include <QtGlobal>

#include <imgui.h>

#include "engine/backend/backend_registry.h"
#include "engine/model/model_loader.h"
#include "storage/session_reader.h"

namespace kv::gui {

const std::vector<ExportChoice>& exportChoices() {
    using storage::ExportFormat;
    using storage::ExportWhat;
    static const std::vector<ExportChoice> choices = {
        {ExportWhat::MEMORY, ExportFormat::CSV, "Memory timeline as CSV…", "CSV files (*.csv)", "csv"},
        {ExportWhat::SPANS, ExportFormat::CSV, "Spans as CSV…", "CSV files (*.csv)", "csv"},
        {ExportWhat::METRICS, ExportFormat::CSV, "Metrics as CSV…", "CSV files (*.csv)", "csv"},
        {ExportWhat::ALL, ExportFormat::CHROME_TRACE, "Chrome trace (spans, memory, metrics)…",
         "Chrome trace JSON (*.json)", "json"},
        {ExportWhat::MEMORY, ExportFormat::TORCH_SNAPSHOT, "PyTorch memory snapshot…", "Pickle files (*.pickle)", "pickle"},
        {ExportWhat::TOKENS, ExportFormat::CSV, "Tokens and per-token loss as CSV…", "CSV files (*.csv)", "csv"},
    };
    return choices;
}

storage::ExportResult exportRun(const QString& session, int64_t run, const ExportChoice& choice, const QString& outPath) {
    storage::SessionReader reader(session.toStdString());
    return storage::export_run(reader, run, choice.what, choice.format, outPath.toStdString());
}

QString smolLm2AssetPath() { return QString::fromStdString(asset_cache_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf"); }

bool smolLm2Installed() { return QFileInfo(smolLm2AssetPath()).isFile(); }

QString versionText() { return QStringLiteral("kvlab %1").arg(QStringLiteral(KVLAB_VERSION)); }

QString buildInfoText() {
    QStringList lines;
    lines << versionText();
    lines << QStringLiteral("cpu backend: %1, %2 threads")
                 .arg(QString::fromStdString(cpu_backend().build_info()))
                 .arg(num_threads());
    lines << QStringLiteral("cpu kernels: %1").arg(QString::fromStdString(cpu_variant_status()));
    lines << QStringLiteral("cuda backend: %1").arg(QString::fromStdString(cuda_status()));
    lines << QStringLiteral("build: %1").arg(QStringLiteral(KVLAB_GUI_BUILD_OPTIONS));
    lines << QStringLiteral("compiler: %1").arg(QStringLiteral(__VERSION__));
    lines << QStringLiteral("Qt %1 (built with %2), Dear ImGui %3").arg(qVersion(), QStringLiteral(QT_VERSION_STR), ImGui::GetVersion());
    return lines.join('\n');
}

}  // namespace kv::gui
