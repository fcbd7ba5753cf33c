// The run form: one editor per option of the engine's option table (run_options()), grouped
// as the table groups them, each with its default and help as tooltip; presets; inline
// validation through the same parsers and cross-field checks the CLI uses, so messages are
// identical and an invalid form cannot launch. Emits requests; it never starts runs itself.
// Day one sits above the sections: mode, a model drop-down (installed real models first), a
// policy drop-down (the policy registry, each with its one-line summary), the cache name and
// the fidelity switch. The Cache section shows the chosen policy's own knobs; the other
// policies' knobs wait under a collapsed "advanced" part.
#pragma once

#include <QString>
#include <QStringList>
#include <QWidget>

#include <map>
#include <string>
#include <vector>

#include "engine/run/run_config.h"

class QButtonGroup;
class QComboBox;
class QFormLayout;
class QLabel;
class QPushButton;
class QTabWidget;
class QToolButton;

namespace kv::gui {

struct RunPreset {
    QString name;
    QString description;
    std::vector<std::pair<std::string, std::string>> values;  // option -> text, over the defaults
};
// The presets; ones on SmolLM2-135M lead when its asset is installed.
const std::vector<RunPreset>& runPresets();
// The model drop-down's entries: smollm2-135m first when installed, then the random presets
// tiny and small (the field also takes a folder or .gguf path).
QStringList modelChoices();

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
    // Adds the registry's policies the drop-down lacks (policies registered at run time: a
    // Python policy file), after the built-ins.
    void refreshPolicies();

    // The policy drop-down (registry names; choosing one sets kv_cache.name's policy part) and
    // the fold holding the other policies' knobs.
    QComboBox* policyCombo() const { return policy_; }
    QToolButton* advancedToggle() const { return advanced_toggle_; }
    // The policy kv_cache.name names ("" when it names none).
    QString chosenPolicy() const;

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
        QWidget* cell = nullptr;  // editor + message, the row's field widget
        bool policyOwn = false;   // a knob of single policies (their options or the shared ones they use)
    };
    void buildField(Field& f, QFormLayout* layout);
    QString fieldText(const Field& f) const;
    void setFieldText(Field& f, const QString& text);
    void setRuntimeOption(RunConfig& cfg, const Field& f, const std::string& text) const;
    void revalidate();
    void placePolicyKnobs();  // the chosen policy's knobs in the Cache section, the rest under "advanced"
    void syncPolicyCombo();

    std::vector<Field> fields_;
    std::map<QString, size_t> by_name_;
    QTabWidget* tabs_ = nullptr;
    QButtonGroup* sections_ = nullptr;  // the tab bar, in rows that fit the dock
    QComboBox* policy_ = nullptr;
    QFormLayout* policy_form_ = nullptr;    // the chosen policy's knobs
    QFormLayout* advanced_form_ = nullptr;  // every other policy's knobs
    QWidget* advanced_box_ = nullptr;
    QToolButton* advanced_toggle_ = nullptr;
    QLabel* policy_heading_ = nullptr;
    bool advanced_opened_for_problem_ = false;  // opened by revalidate, not by the person
    QString placed_for_;  // the policy the knobs were last placed for
    QComboBox* presets_ = nullptr;
    QLabel* summary_ = nullptr;
    QPushButton *launch_ = nullptr, *compare_ = nullptr, *cancel_ = nullptr, *reset_ = nullptr;
    RunConfig config_;
    QStringList problems_;
    bool loading_ = false;  // suppresses revalidation while many fields change
};

}  // namespace kv::gui
