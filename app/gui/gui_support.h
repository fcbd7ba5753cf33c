// Small shared pieces of the app: the export choices (the same storage::export_run the CLI's
// `kvlab export` calls) and the version / build text for Help > About. No widgets.
#pragma once

#include <QString>

#include <cstdint>
#include <vector>

#include "storage/exports.h"

namespace kv::gui {

struct ExportChoice {
    storage::ExportWhat what;
    storage::ExportFormat format;
    QString title;   // menu text
    QString filter;  // file dialog filter
    QString suffix;  // default file suffix
};
const std::vector<ExportChoice>& exportChoices();

// Writes one run of `session` like `kvlab export`; throws kv::Error / storage::SessionError.
storage::ExportResult exportRun(const QString& session, int64_t run, const ExportChoice& choice, const QString& outPath);

// The real model the setup script installs: the file the model name "smollm2-135m" loads
// (engine/model/model_loader.cpp), and whether it is there.
QString smolLm2AssetPath();
bool smolLm2Installed();

// "kvlab 0.1.0", backends, build options, Qt and ImGui versions (one fact per line).
QString versionText();
QString buildInfoText();

}  // namespace kv::gui
