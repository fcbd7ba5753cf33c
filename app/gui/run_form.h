// The run form: one editor per option of the engine's option table (run_options()), grouped
// as the table groups them, each with its default and help as tooltip; presets; inline
// validation through the same parsers and cross-field checks the CLI uses, so messages are
// identical and an invalid form cannot launch. Emits requests; it never starts runs itself.
#pragma once

#include <QString>
#include <QStringList>
#include <QWidget>

#include <map>
#include <string>
#include <vector>

#include "engine/run/run_config.h"

class QComboBox;
class QFormLayout;
class QLabel;
class QPushButton;
class QTabWidget;

namespace kv::gui {

struct RunPreset {
    QString name;
    QString description;
    std::vector<std::pair<std::string, std::string>> values;  // option -> text, over the defaults
};
const std::vector<RunPreset>& runPresets();

class RunForm : public QWidget {
    Q_OBJECT
   public:
    explicit RunForm(QWidget* parent = nullptr);

    // The configuration the fields describe (only meaningful when isValid()).
    RunConfig config() const { return config_; }
    bool isValid() const { return problems_.isEmpty(); }
    QStringList problems() const { return problems_; }

    // Option names as in run_options() plus the runtime ones: threads, device, memory.budget.
    void setValue(const QString& option, const QString& value);
    QString value(const QString& option) const;
    QString message(const QString& option) const;  // the inline message ("" when fine)
    QWidget* editor(const QString& option) const;
    QStringList optionNames() const;
    QStringList groupNames() const;

    void applyPreset(const QString& name);  // resets to defaults first
    void resetToDefaults();
    // Loads a configuration (e.g. a selected run's JSON or the last session's form).
    void setConfig(const RunConfig& cfg);
    void setSessionBusy(bool busy);  // enables Cancel

    QPushButton* launchButton() const { return launch_; }
    QPushButton* compareButton() const { return compare_; }
    QPushButton* cancelButton() const { return cancel_; }

   Q_SIGNALS:
    void launchRequested(const kv::RunConfig& cfg);
    void compareRequested(const kv::RunConfig& base);
    void cancelRequested();
    void validityChanged(bool valid);

   private:
    struct Field {
        const OptionDef* opt = nullptr;  // null for runtime fields
        QString name, group, help, defaultValue;
        QWidget* editor = nullptr;
        QLabel* label = nullptr;
        QLabel* message = nullptr;
    };
    void buildField(Field& f, QFormLayout* layout);
    QString fieldText(const Field& f) const;
    void setFieldText(Field& f, const QString& text);
    void setRuntimeOption(RunConfig& cfg, const Field& f, const std::string& text) const;
    void revalidate();

    std::vector<Field> fields_;
    std::map<QString, size_t> by_name_;
    QTabWidget* tabs_ = nullptr;
    QComboBox* presets_ = nullptr;
    QLabel* summary_ = nullptr;
    QPushButton *launch_ = nullptr, *compare_ = nullptr, *cancel_ = nullptr, *reset_ = nullptr;
    RunConfig config_;
    QStringList problems_;
    bool loading_ = false;  // suppresses revalidation while many fields change
};

}  // namespace kv::gui
