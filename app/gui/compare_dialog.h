// "Compare policies…": one run per chosen policy x buffer with everything else equal to the
// form's configuration, plus a reference run (dense, or the first policy with a cache as long
// as the sequence). The dialog only builds and checks configurations; the caller launches.
#pragma once

#include <QDialog>
#include <QStringList>

#include <vector>

#include "engine/run/run_config.h"

class QComboBox;
class QLabel;
class QListWidget;
class QDialogButtonBox;

namespace kv::gui {

enum class CompareReference { DENSE, LARGE_CACHE };

// Reference first, then policy-major order. Names say what differs ("h2o-q8 L=512").
std::vector<RunConfig> compareConfigs(const RunConfig& base, const QStringList& policies, const QStringList& buffers,
                                      CompareReference reference);

class CompareDialog : public QDialog {
    Q_OBJECT
   public:
    explicit CompareDialog(const RunConfig& base, QWidget* parent = nullptr);

    void setSelection(const QStringList& policies, const QStringList& buffers, CompareReference reference);
    QStringList policies() const;
    QStringList buffers() const;
    CompareReference reference() const;
    std::vector<RunConfig> configs() const;
    QStringList problems() const { return problems_; }

   private:
    void update();
    RunConfig base_;
    QListWidget* policies_ = nullptr;
    QListWidget* buffers_ = nullptr;
    QComboBox* reference_ = nullptr;
    QLabel* summary_ = nullptr;
    QDialogButtonBox* buttons_ = nullptr;
    QStringList problems_;
};

}  // namespace kv::gui
