// "Compare policies…": one run per chosen policy x buffer with everything else equal to the
// form's configuration, plus a reference run (dense, or the first policy with a cache as long
// as the sequence). With several cache lengths it is a sweep over cache sizes (one run per
// policy x buffer x length, one reference), drawn by the sweep view. The dialog only builds and
// checks configurations; the caller launches.
#pragma once

#include <QDialog>
#include <QStringList>

#include <vector>

#include "engine/run/run_config.h"

class QComboBox;
class QLineEdit;
class QLabel;
class QListWidget;
class QDialogButtonBox;

namespace kv::gui {

enum class CompareReference { DENSE, LARGE_CACHE };

// Reference first, then policy-major order. Names say what differs ("h2o-q8 L=512").
// cache_lengths: the lengths to sweep (empty: the form's).
std::vector<RunConfig> compareConfigs(const RunConfig& base, const QStringList& policies, const QStringList& buffers,
                                      CompareReference reference, const std::vector<int64_t>& cache_lengths = {});
// "256, 512 1024" -> {256, 512, 1024}; false (and *problem says why) for anything else.
bool parseCacheLengths(const QString& text, std::vector<int64_t>* out, QString* problem);
// The most runs one Compare policies... launch makes (a sweep's grid included).
constexpr size_t kMaxCompareLaunch = 32;

class CompareDialog : public QDialog {
    Q_OBJECT
   public:
    explicit CompareDialog(const RunConfig& base, QWidget* parent = nullptr);

    void setSelection(const QStringList& policies, const QStringList& buffers, CompareReference reference);
    QStringList policies() const;
    QStringList buffers() const;
    CompareReference reference() const;
    std::vector<int64_t> cacheLengths() const;  // as typed (the form's length when unreadable)
    void setCacheLengths(const QString& text);
    std::vector<RunConfig> configs() const;
    QStringList problems() const { return problems_; }

   private:
    void update();
    RunConfig base_;
    QListWidget* policies_ = nullptr;
    QListWidget* buffers_ = nullptr;
    QComboBox* reference_ = nullptr;
    QLineEdit* lengths_ = nullptr;
    QLabel* summary_ = nullptr;
    QDialogButtonBox* buttons_ = nullptr;
    QStringList problems_;
};

}  // namespace kv::gui
