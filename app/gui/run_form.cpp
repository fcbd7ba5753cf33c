// Run form (see run_form.h). Editors are generated from run_options(); nothing here repeats an
// option's name, default, bounds or message.
#include "run_form.h"

#include <QCheckBox>
#include <QComboBox>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QScrollArea>
#include <QTabWidget>
#include <QVBoxLayout>

#include <cerrno>
#include <cstdlib>

#include "engine/backend/backend_registry.h"
#include "engine/core/device.h"
#include "engine/core/error.h"

namespace kv::gui {

const std::vector<RunPreset>& runPresets() {
    static const std::vector<RunPreset> presets = {
        {"passkey 8k, tiny model",
         "passkey retrieval over 8192 tokens, H2O with 1024 slots, chunks of 128 (a few seconds)",
         {{"mode", "eval_long"}, {"model", "tiny"}, {"data", "passkey"}, {"data.seq_length", "8192"},
          {"data.num_samples", "4"}, {"kv_cache.name", "h2o-default"}, {"kv_cache.cache_length", "1024"},
          {"kv_cache.chunk_size", "128"}}},
        {"passkey 2k, tiny model (quick)",
         "passkey retrieval over 2048 tokens, H2O with 256 slots, chunks of 32 (about a second)",
         {{"mode", "eval_long"}, {"model", "tiny"}, {"data", "passkey"}, {"data.seq_length", "2048"},
          {"data.num_samples", "2"}, {"kv_cache.name", "h2o-default"}, {"kv_cache.cache_length", "256"},
          {"kv_cache.chunk_size", "32"}}},
        {"recall 4k, tiny model, h2o-q8",
         "multi-key associative recall over 4096 tokens with an 8-bit quantized H2O cache",
         {{"mode", "eval_long"}, {"model", "tiny"}, {"data", "recall"}, {"data.seq_length", "4096"},
          {"data.num_keys", "32"}, {"kv_cache.name", "h2o-q8"}, {"kv_cache.cache_length", "512"},
          {"kv_cache.chunk_size", "64"}}},
        {"needle 16k, small model",
         "needle in a haystack over 16384 tokens on the 6-layer preset, last-recent cache of 2048 slots",
         {{"mode", "eval_long"}, {"model", "small"}, {"data", "needle"}, {"data.seq_length", "16384"},
          {"data.num_samples", "1"}, {"kv_cache.name", "lastrec-default"}, {"kv_cache.cache_length", "2048"},
          {"kv_cache.chunk_size", "256"}}},
        {"dense reference, passkey 8k",
         "the whole sequence in the cache: the reference the policies are compared with",
         {{"mode", "eval_long"}, {"model", "tiny"}, {"data", "passkey"}, {"data.seq_length", "8192"},
          {"data.num_samples", "4"}, {"kv_cache.name", "dense-default"}, {"kv_cache.cache_length", "0"},
          {"kv_cache.chunk_size", "128"}}},
    };
    return presets;
}

namespace {

// Tabs in the order of the option table's groups; "mode" sits above the tabs.
const char* const kRuntimeGroup = "runtime";

QString tabTitle(const QString& group) {
    QString t = group;
    if (!t.isEmpty()) t[0] = t[0].toUpper();
    return t;
}

// "--kv_cache.chunk_size: 64 is larger ..." / "--data.path is required ..." -> the option name.
QString optionOfMessage(const QString& msg) {
    if (!msg.startsWith(QLatin1String("--"))) return {};
    int end = 2;
    while (end < msg.size() && msg[end] != ':' && msg[end] != ' ') ++end;
    return msg.mid(2, end - 2);
}

}  // namespace

RunForm::RunForm(QWidget* parent) : QWidget(parent) {
    loading_ = true;  // editors signal while they are built; validate once at the end
    auto* top = new QVBoxLayout(this);
    top->setContentsMargins(4, 4, 4, 4);

    auto* presetRow = new QHBoxLayout;
    presetRow->addWidget(new QLabel(tr("Preset:")));
    presets_ = new QComboBox;
    presets_->setObjectName("presetCombo");
    presets_->addItem(tr("(choose a preset)"));
    for (const auto& p : runPresets()) {
        presets_->addItem(p.name);
        presets_->setItemData(presets_->count() - 1, p.description, Qt::ToolTipRole);
    }
    presetRow->addWidget(presets_, 1);
    top->addLayout(presetRow);
    connect(presets_, qOverload<int>(&QComboBox::activated), this, [this](int i) {
        if (i > 0) applyPreset(presets_->itemText(i));
    });

    // Fields: every option of the table, plus the runtime settings the CLI takes as global options.
    for (const auto& o : run_options()) {
        Field f;
        f.opt = &o;
        f.name = QString::fromStdString(o.name);
        f.group = QString::fromStdString(o.group);
        f.help = QString::fromStdString(o.help);
        f.defaultValue = QString::fromStdString(o.get(RunConfig{}));
        fields_.push_back(f);
    }
    const RunConfig defaults;
    auto runtime = [this](const char* name, const char* help, const QString& def) {
        Field f;
        f.name = name, f.group = kRuntimeGroup, f.help = help, f.defaultValue = def;
        fields_.push_back(f);
    };
    runtime("threads", "CPU worker threads for this run (0: all cores)", QString::number(defaults.threads));
    runtime("device", "where the run computes: cpu or cuda:N", QString::fromStdString(defaults.device));
    runtime("memory.budget", "memory budget of the device, e.g. 8GiB (empty: none)", QString::fromStdString(defaults.memory_budget));
    for (size_t i = 0; i < fields_.size(); ++i) by_name_[fields_[i].name] = i;

    auto* modeForm = new QFormLayout;
    tabs_ = new QTabWidget;
    tabs_->setObjectName("formTabs");
    tabs_->setDocumentMode(true);
    std::map<QString, QFormLayout*> layouts;
    for (auto& f : fields_) {
        QFormLayout* layout = nullptr;
        if (f.group == QLatin1String("mode")) {
            layout = modeForm;
        } else if (auto it = layouts.find(f.group); it != layouts.end()) {
            layout = it->second;
        } else {
            auto* page = new QWidget;
            layout = new QFormLayout(page);
            layout->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
            auto* scroll = new QScrollArea;
            scroll->setWidgetResizable(true);
            scroll->setFrameShape(QFrame::NoFrame);
            scroll->setWidget(page);
            scroll->setProperty("group", f.group);
            tabs_->addTab(scroll, tabTitle(f.group));
            layouts[f.group] = layout;
        }
        buildField(f, layout);
    }
    top->addLayout(modeForm);
    top->addWidget(tabs_, 1);

    summary_ = new QLabel;
    summary_->setObjectName("formSummary");
    summary_->setWordWrap(true);
    summary_->setTextInteractionFlags(Qt::TextSelectableByMouse);
    top->addWidget(summary_);

    auto* buttons = new QHBoxLayout;
    reset_ = new QPushButton(tr("Defaults"));
    reset_->setToolTip(tr("Reset every field to the option table's default"));
    launch_ = new QPushButton(tr("Launch"));
    launch_->setObjectName("launchButton");
    launch_->setDefault(true);
    launch_->setToolTip(tr("Start this run on the session's worker thread"));
    compare_ = new QPushButton(tr("Compare policies…"));
    compare_->setObjectName("compareButton");
    compare_->setToolTip(tr("One run per chosen policy and buffer, everything else equal, plus a reference"));
    cancel_ = new QPushButton(tr("Cancel"));
    cancel_->setObjectName("cancelButton");
    cancel_->setToolTip(tr("Stop the active runs (each stops within one chunk)"));
    cancel_->setEnabled(false);
    buttons->addWidget(reset_);
    buttons->addStretch(1);
    buttons->addWidget(cancel_);
    buttons->addWidget(compare_);
    buttons->addWidget(launch_);
    top->addLayout(buttons);
    connect(reset_, &QPushButton::clicked, this, &RunForm::resetToDefaults);
    connect(launch_, &QPushButton::clicked, this, [this] {
        if (isValid()) Q_EMIT launchRequested(config_);
    });
    connect(compare_, &QPushButton::clicked, this, [this] {
        if (isValid()) Q_EMIT compareRequested(config_);
    });
    connect(cancel_, &QPushButton::clicked, this, &RunForm::cancelRequested);
    loading_ = false;
    revalidate();
}

void RunForm::buildField(Field& f, QFormLayout* layout) {
    const OptionDef* o = f.opt;
    const QString tip = QStringLiteral("<b>--%1</b><br>%2<br>default: <i>%3</i>")
                            .arg(f.name, f.help.toHtmlEscaped(), f.defaultValue.isEmpty() ? tr("(empty)") : f.defaultValue.toHtmlEscaped());
    if (o && o->type == OptionType::BOOL) {
        auto* cb = new QCheckBox;
        connect(cb, &QCheckBox::toggled, this, [this] { revalidate(); });
        f.editor = cb;
    } else if ((o && !o->choices.empty()) || f.name == QLatin1String("device")) {
        auto* combo = new QComboBox;
        // The cache name is checked by structure, so it may be typed; other lists are closed.
        combo->setEditable(f.name == QLatin1String("kv_cache.name"));
        if (o)
            for (const auto& c : o->choices) combo->addItem(QString::fromStdString(c));
        else {
            combo->addItem("cpu");
            if (cuda_available()) combo->addItem("cuda:0");
            combo->setEditable(true);
        }
        connect(combo, &QComboBox::currentTextChanged, this, [this] { revalidate(); });
        f.editor = combo;
    } else {
        auto* edit = new QLineEdit;
        edit->setPlaceholderText(f.defaultValue);
        edit->setClearButtonEnabled(false);
        connect(edit, &QLineEdit::textChanged, this, [this] { revalidate(); });
        f.editor = edit;
    }
    f.editor->setObjectName(QStringLiteral("field:") + f.name);
    f.editor->setToolTip(tip);
    f.message = new QLabel;
    f.message->setObjectName(QStringLiteral("message:") + f.name);
    f.message->setWordWrap(true);
    f.message->setStyleSheet("color: #d03030;");
    f.message->hide();
    auto* cell = new QWidget;
    auto* v = new QVBoxLayout(cell);
    v->setContentsMargins(0, 0, 0, 0);
    v->setSpacing(1);
    v->addWidget(f.editor);
    v->addWidget(f.message);
    f.label = new QLabel(f.name);
    f.label->setToolTip(tip);
    layout->addRow(f.label, cell);
    setFieldText(f, f.defaultValue);
}

QString RunForm::fieldText(const Field& f) const {
    if (auto* cb = qobject_cast<QCheckBox*>(f.editor)) return cb->isChecked() ? "true" : "false";
    if (auto* combo = qobject_cast<QComboBox*>(f.editor)) return combo->currentText();
    if (auto* edit = qobject_cast<QLineEdit*>(f.editor)) return edit->text();
    return {};
}

void RunForm::setFieldText(Field& f, const QString& text) {
    if (auto* cb = qobject_cast<QCheckBox*>(f.editor)) {
        cb->setChecked(text == "true" || text == "1" || text == "yes" || text == "True");
    } else if (auto* combo = qobject_cast<QComboBox*>(f.editor)) {
        int i = combo->findText(text);
        if (i < 0 && !combo->isEditable()) {
            combo->addItem(text);  // e.g. a value from an older run; validation will name it
            i = combo->count() - 1;
        }
        if (combo->isEditable()) combo->setEditText(text);
        if (i >= 0) combo->setCurrentIndex(i);
    } else if (auto* edit = qobject_cast<QLineEdit*>(f.editor)) {
        edit->setText(text);
    }
}

void RunForm::setRuntimeOption(RunConfig& cfg, const Field& f, const std::string& v) const {
    if (f.name == QLatin1String("threads")) {
        // Same bounds and wording as the CLI's global --threads.
        char* end = nullptr;
        errno = 0;
        long long x = std::strtoll(v.c_str(), &end, 10);
        if (v.empty() || *end || errno == ERANGE)
            throw Error(str("--threads: '", v, "' is not an integer; expected a whole number in [0, 1024]"));
        if (x < 0 || x > 1024) throw Error(str("--threads: ", x, " is out of range; expected a whole number in [0, 1024]"));
        cfg.threads = x;
    } else if (f.name == QLatin1String("device")) {
        try {
            parse_device(v);
        } catch (const Error& e) {
            throw Error(str("--device: ", e.what()));
        }
        cfg.device = v;
    } else if (f.name == QLatin1String("memory.budget")) {
        if (!v.empty()) parse_bytes(v, "--memory.budget");  // throws the CLI's message
        cfg.memory_budget = v;
    }
}

void RunForm::revalidate() {
    if (loading_) return;
    RunConfig cfg;
    QStringList problems;
    std::map<QString, QString> messages;
    for (const auto& f : fields_) {
        const std::string text = fieldText(f).toStdString();
        try {
            if (f.opt)
                f.opt->set(cfg, text);
            else
                setRuntimeOption(cfg, f, text);
        } catch (const Error& e) {
            const QString m = QString::fromStdString(e.what());
            messages[f.name] = m;
            problems << m;
        }
    }
    QStringList general;
    if (problems.isEmpty()) {
        for (const auto& p : run_config_problems(cfg)) {
            const QString m = QString::fromStdString(p);
            problems << m;
            const QString opt = optionOfMessage(m);
            if (by_name_.count(opt) && !messages.count(opt))
                messages[opt] = m;
            else
                general << m;
        }
    }
    // Tabs holding a problem get a marker, so a message on a hidden tab is not missed.
    std::map<QString, bool> groupBad;
    for (auto& f : fields_) {
        auto it = messages.find(f.name);
        const bool bad = it != messages.end();
        f.message->setText(bad ? it->second : QString());
        f.message->setVisible(bad);
        if (bad) groupBad[f.group] = true;
        QFont font = f.label->font();
        font.setBold(fieldText(f) != f.defaultValue);  // changed from the default
        f.label->setFont(font);
    }
    for (int i = 0; i < tabs_->count(); ++i) {
        const QString g = tabs_->widget(i)->property("group").toString();
        tabs_->setTabText(i, tabTitle(g) + (groupBad[g] ? QStringLiteral(" ⚠") : QString()));
    }
    const bool wasValid = problems_.isEmpty();
    problems_ = problems;
    if (problems.isEmpty()) config_ = cfg;
    launch_->setEnabled(problems.isEmpty());
    compare_->setEnabled(problems.isEmpty());
    if (problems.isEmpty()) {
        summary_->setStyleSheet({});
        summary_->setText(tr("Ready: %1 on %2, %3").arg(QString::fromStdString(cfg.mode), QString::fromStdString(cfg.model),
                                                       QString::fromStdString(cfg.kv_cache.name)));
    } else {
        summary_->setStyleSheet("color: #d03030;");
        summary_->setText(general.isEmpty() ? tr("%n problem(s); fix the marked fields to launch", nullptr, int(problems.size()))
                                            : general.join('\n'));
    }
    if (wasValid != problems_.isEmpty()) Q_EMIT validityChanged(problems_.isEmpty());
}

void RunForm::setValue(const QString& option, const QString& value) {
    auto it = by_name_.find(option);
    if (it == by_name_.end()) return;
    setFieldText(fields_[it->second], value);
    revalidate();
}

QString RunForm::value(const QString& option) const {
    auto it = by_name_.find(option);
    return it == by_name_.end() ? QString() : fieldText(fields_[it->second]);
}

QString RunForm::message(const QString& option) const {
    auto it = by_name_.find(option);
    return it == by_name_.end() ? QString() : fields_[it->second].message->text();
}

QWidget* RunForm::editor(const QString& option) const {
    auto it = by_name_.find(option);
    return it == by_name_.end() ? nullptr : fields_[it->second].editor;
}

QStringList RunForm::optionNames() const {
    QStringList names;
    for (const auto& f : fields_) names << f.name;
    return names;
}

QStringList RunForm::groupNames() const {
    QStringList groups;
    for (const auto& f : fields_)
        if (!groups.contains(f.group)) groups << f.group;
    return groups;
}

void RunForm::resetToDefaults() {
    loading_ = true;
    for (auto& f : fields_) setFieldText(f, f.defaultValue);
    loading_ = false;
    revalidate();
}

void RunForm::applyPreset(const QString& name) {
    for (const auto& p : runPresets()) {
        if (p.name != name) continue;
        loading_ = true;
        for (auto& f : fields_) setFieldText(f, f.defaultValue);
        for (const auto& [opt, v] : p.values)
            if (auto it = by_name_.find(QString::fromStdString(opt)); it != by_name_.end())
                setFieldText(fields_[it->second], QString::fromStdString(v));
        loading_ = false;
        presets_->setCurrentIndex(presets_->findText(name));
        revalidate();
        return;
    }
}

void RunForm::setConfig(const RunConfig& cfg) {
    loading_ = true;
    for (auto& f : fields_) {
        QString v;
        if (f.opt) v = QString::fromStdString(f.opt->get(cfg));
        else if (f.name == QLatin1String("threads")) v = QString::number(cfg.threads);
        else if (f.name == QLatin1String("device")) v = QString::fromStdString(cfg.device);
        else v = QString::fromStdString(cfg.memory_budget);
        setFieldText(f, v);
    }
    loading_ = false;
    revalidate();
}

void RunForm::setSessionBusy(bool busy) { cancel_->setEnabled(busy); }

}  // namespace kv::gui
