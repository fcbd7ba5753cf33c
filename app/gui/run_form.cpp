// Run form (see run_form.h). Editors are generated from run_options(); nothing here repeats an
// option's name, default, bounds or message.
#include "run_form.h"

#include <QButtonGroup>
#include <QCheckBox>
#include <QComboBox>
#include <QGridLayout>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QResizeEvent>
#include <QAbstractItemView>
#include <QScrollArea>
#include <QStylePainter>
#include <QTabBar>
#include <QTabWidget>
#include <QToolButton>
#include <QVBoxLayout>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <set>

#include "engine/backend/backend_registry.h"
#include "engine/core/device.h"
#include "engine/core/error.h"
#include "engine/kv/policies/policy_registry.h"
#include "engine/model/model_loader.h"
#include "gui_support.h"

namespace kv::gui {

const std::vector<RunPreset>& runPresets() {
    static const std::vector<RunPreset> presets = [] {
        std::vector<RunPreset> list;
        // A real model first when it is installed: on random weights the policies' numbers say
        // nothing about the policies.
        if (smolLm2Installed()) {
            list.push_back({"repeat 1k, SmolLM2-135M, h2o 256 + fidelity",
                            "copy a 64-token span seen 384 tokens earlier with H2O keeping 256 slots; fidelity measures "
                            "the distance to the dense model (about half a minute)",
                            {{"mode", "eval_long"}, {"model", "smollm2-135m"}, {"data", "repeat"}, {"data.seq_length", "1024"},
                             {"data.num_samples", "1"}, {"data.repeat_length", "64"}, {"data.repeat_distance", "384"},
                             {"kv_cache.name", "h2o-default"}, {"kv_cache.cache_length", "256"}, {"kv_cache.chunk_size", "64"},
                             {"fidelity", "true"}}});
            list.push_back({"licence text 1k, SmolLM2-135M, tova 256 + fidelity",
                            "next-token loss on the GPL-3 text with TOVA keeping 256 slots, fidelity on (about half a minute)",
                            {{"mode", "eval_long"}, {"model", "smollm2-135m"}, {"data", "text"}, {"data.seq_length", "1024"},
                             {"data.num_samples", "1"}, {"data.files", "/usr/share/common-licenses/GPL-3"},
                             {"kv_cache.name", "tova-default"}, {"kv_cache.cache_length", "256"}, {"kv_cache.chunk_size", "64"},
                             {"fidelity", "true"}}});
        }
        const std::vector<RunPreset> tiny = {
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
        list.insert(list.end(), tiny.begin(), tiny.end());
        return list;
    }();
    return presets;
}

QStringList modelChoices() {
    QStringList m;
    if (smolLm2Installed()) m << QStringLiteral("smollm2-135m");
    m << QStringLiteral("tiny") << QStringLiteral("small");
    return m;
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

// The options that belong to single policies: every policy's own options and the shared
// kv_cache.* options some policy reads (PolicyInfo::uses), as run option names.
std::set<std::string> policyKnobs(const PolicyInfo* only = nullptr) {
    std::set<std::string> knobs;
    for (const PolicyInfo& p : policy_registry()) {
        if (only && &p != only) continue;
        for (const auto& u : p.uses) knobs.insert("kv_cache." + u);
        for (const auto& o : p.options) knobs.insert("kv_cache." + o.name);
    }
    return knobs;
}

// A field's editor with its message (and notes) below. It reports no height-for-width: a
// QFormLayout in a scroll area squeezes every row of a form whose cells do (Qt 6.4), which cut
// the Cache section's messages; the cell sizes itself for its current width instead.
class FieldCell : public QWidget {
   public:
    bool hasHeightForWidth() const override { return false; }
    QSize sizeHint() const override { return fitted(QWidget::sizeHint()); }
    QSize minimumSizeHint() const override { return fitted(QWidget::minimumSizeHint()); }

   protected:
    void resizeEvent(QResizeEvent* e) override {
        QWidget::resizeEvent(e);
        if (e->oldSize().width() != width()) updateGeometry();  // wrapped lines change with the width
    }

   private:
    QSize fitted(QSize s) const {
        const QLayout* l = layout();
        if (!l) return s;
        int h = 0, shown = 0;
        for (int i = 0; i < l->count(); ++i) {
            QWidget* w = l->itemAt(i)->widget();
            if (!w || w->isHidden()) continue;
            h += w->hasHeightForWidth() ? w->heightForWidth(std::max(width(), 80)) : w->sizeHint().height();
            ++shown;
        }
        s.setHeight(h + std::max(0, shown - 1) * l->spacing());
        return s;
    }
};

// The policy drop-down: its entries carry the policy's summary, longer than the dock is wide;
// the closed box ends the text with "…" instead of cutting it mid-word.
class ElidingComboBox : public QComboBox {
   protected:
    void paintEvent(QPaintEvent*) override {
        QStylePainter p(this);
        QStyleOptionComboBox opt;
        initStyleOption(&opt);
        p.drawComplexControl(QStyle::CC_ComboBox, opt);
        const QRect text = style()->subControlRect(QStyle::CC_ComboBox, &opt, QStyle::SC_ComboBoxEditField, this);
        opt.currentText = fontMetrics().elidedText(opt.currentText, Qt::ElideRight, text.width());
        p.drawControl(QStyle::CE_ComboBoxLabel, opt);
    }
};

// Shown above the sections: what a first run needs.
bool onTop(const QString& option) {
    return option == QLatin1String("model") || option == QLatin1String("kv_cache.name") || option == QLatin1String("fidelity");
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
    modeForm->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    tabs_ = new QTabWidget;
    tabs_->setObjectName("formTabs");
    tabs_->setDocumentMode(true);
    const std::set<std::string> knobs = policyKnobs();
    std::map<QString, QFormLayout*> layouts;
    for (auto& f : fields_) {
        f.policyOwn = knobs.count(f.name.toStdString()) > 0;
        QFormLayout* layout = nullptr;
        if (f.group == QLatin1String("mode") || onTop(f.name)) {
            layout = modeForm;
        } else if (auto it = layouts.find(f.group); it != layouts.end()) {
            layout = it->second;
        } else {
            auto* page = new QWidget;
            auto* pageLayout = new QVBoxLayout(page);
            layout = new QFormLayout;
            layout->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
            layout->setRowWrapPolicy(QFormLayout::WrapLongRows);  // long option names above their editor
            pageLayout->addLayout(layout);
            if (f.group == QLatin1String("cache")) {
                // The chosen policy's knobs, then everyone else's, folded away.
                policy_heading_ = new QLabel;
                policy_heading_->setObjectName("policyHeading");
                pageLayout->addSpacing(6);
                pageLayout->addWidget(policy_heading_);
                policy_form_ = new QFormLayout;
                policy_form_->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
                policy_form_->setRowWrapPolicy(QFormLayout::WrapLongRows);
                pageLayout->addLayout(policy_form_);
                advanced_toggle_ = new QToolButton;
                advanced_toggle_->setObjectName("advancedToggle");
                advanced_toggle_->setCheckable(true);
                advanced_toggle_->setToolButtonStyle(Qt::ToolButtonTextBesideIcon);
                advanced_toggle_->setArrowType(Qt::RightArrow);
                advanced_toggle_->setAutoRaise(true);
                advanced_toggle_->setText(tr("Advanced: the other policies' knobs"));
                advanced_toggle_->setToolTip(tr("Options the chosen policy does not read; they matter only for the policies named in their help"));
                pageLayout->addSpacing(6);
                pageLayout->addWidget(advanced_toggle_);
                advanced_form_ = new QFormLayout;
                advanced_form_->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
                advanced_form_->setRowWrapPolicy(QFormLayout::WrapLongRows);
                pageLayout->addLayout(advanced_form_);
                connect(advanced_toggle_, &QToolButton::clicked, this, [this] { advanced_opened_for_problem_ = false; });
                connect(advanced_toggle_, &QToolButton::toggled, this, [this](bool open) {
                    advanced_toggle_->setArrowType(open ? Qt::DownArrow : Qt::RightArrow);
                    for (int r = 0; r < advanced_form_->rowCount(); ++r) advanced_form_->setRowVisible(r, open);
                });
            }
            pageLayout->addStretch(1);
            auto* scroll = new QScrollArea;
            scroll->setWidgetResizable(true);
            scroll->setFrameShape(QFrame::NoFrame);
            // Never sideways: rows wrap and messages word-wrap to the dock's width instead.
            scroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
            scroll->setWidget(page);
            scroll->setProperty("group", f.group);
            tabs_->addTab(scroll, tabTitle(f.group));
            layouts[f.group] = layout;
        }
        if (f.policyOwn && policy_form_ && !onTop(f.name)) layout = policy_form_;  // placePolicyKnobs sorts them
        if (f.name == QLatin1String("kv_cache.name")) {
            // The policy drop-down: the registry's names, each with its one-line summary.
            policy_ = new ElidingComboBox;
            policy_->setObjectName("policyCombo");
            policy_->setSizeAdjustPolicy(QComboBox::AdjustToMinimumContentsLengthWithIcon);
            policy_->setMinimumContentsLength(14);
            policy_->setPlaceholderText(tr("(not a policy of the registry)"));
            for (const PolicyInfo& p : policy_registry()) {
                policy_->addItem(QStringLiteral("%1 — %2").arg(QString::fromStdString(p.name), QString::fromStdString(p.summary)),
                                 QString::fromStdString(p.name));
                policy_->setItemData(policy_->count() - 1, QString::fromStdString(p.summary), Qt::ToolTipRole);
            }
            // The list shows each summary whole (up to a wide screen's worth).
            policy_->view()->setMinimumWidth(std::min(900, policy_->view()->sizeHintForColumn(0) + 24));
            policy_->setToolTip(tr("The eviction policy; sets the policy part of kv_cache.name (its buffer stays when the policy allows it)"));
            connect(policy_, qOverload<int>(&QComboBox::activated), this, [this](int i) {
                const std::string name = policy_->itemData(i).toString().toStdString();
                const PolicyInfo* p = find_policy(name);
                if (!p) return;
                // Keep the buffer part when the new policy takes it, else its first buffer.
                const QString cur = value(QStringLiteral("kv_cache.name"));
                const QString pol = chosenPolicy();
                std::string buffer = pol.isEmpty() || cur.size() <= pol.size() + 1 ? "default" : cur.mid(pol.size() + 1).toStdString();
                if (!p->buffers.empty() && std::find(p->buffers.begin(), p->buffers.end(), buffer) == p->buffers.end())
                    buffer = p->buffers.front();
                loading_ = true;  // one revalidation for both fields
                setFieldText(fields_[by_name_.at(QStringLiteral("kv_cache.name"))], QString::fromStdString(name + "-" + buffer));
                // From dense (0 = the whole sequence) to a policy that needs a budget: a quarter of
                // the sequence, so the pick is launchable at once (the field stays editable).
                if (p->needs_cache_length && value(QStringLiteral("kv_cache.cache_length")) == QLatin1String("0")) {
                    const qint64 seq = value(QStringLiteral("data.seq_length")).toLongLong();
                    if (seq > 0)
                        setFieldText(fields_[by_name_.at(QStringLiteral("kv_cache.cache_length"))], QString::number(std::max<qint64>(1, seq / 4)));
                }
                loading_ = false;
                revalidate();
            });
            modeForm->addRow(tr("policy"), policy_);
        }
        buildField(f, layout);
    }
    top->addLayout(modeForm);
    // The sections as rows of toggle buttons: nine tabs do not fit a dock's width in one bar.
    tabs_->tabBar()->hide();
    sections_ = new QButtonGroup(this);
    auto* sectionGrid = new QGridLayout;
    sectionGrid->setSpacing(2);
    const int perRow = (tabs_->count() + 1) / 2;
    for (int i = 0; i < tabs_->count(); ++i) {
        auto* b = new QToolButton;
        b->setObjectName(QStringLiteral("section:") + tabs_->widget(i)->property("group").toString());
        b->setText(tabs_->tabText(i));
        b->setCheckable(true);
        b->setAutoRaise(true);
        b->setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Fixed);
        sections_->addButton(b, i);
        sectionGrid->addWidget(b, i / perRow, i % perRow);
    }
    if (auto* first = sections_->button(0)) first->setChecked(true);
    connect(sections_, &QButtonGroup::idClicked, tabs_, &QTabWidget::setCurrentIndex);
    connect(tabs_, &QTabWidget::currentChanged, this, [this](int i) {
        if (auto* b = sections_->button(i)) b->setChecked(true);
    });
    top->addLayout(sectionGrid);
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
    QString tip = QStringLiteral("<b>--%1</b><br>%2<br>default: <i>%3</i>")
                      .arg(f.name, f.help.toHtmlEscaped(), f.defaultValue.isEmpty() ? tr("(empty)") : f.defaultValue.toHtmlEscaped());
    const bool isModel = f.name == QLatin1String("model");
    if (isModel)
        tip += smolLm2Installed()
                   ? tr("<br><b>smollm2-135m</b>: SmolLM2-135M-Instruct, real weights (installed: %1)").arg(smolLm2AssetPath().toHtmlEscaped())
                   : tr("<br><b>smollm2-135m</b>: SmolLM2-135M-Instruct, real weights (not installed: %1)")
                         .arg(QString::fromStdString(asset_fetch_hint()).toHtmlEscaped());
    if (o && o->type == OptionType::BOOL) {
        auto* cb = new QCheckBox;
        connect(cb, &QCheckBox::toggled, this, [this] { revalidate(); });
        f.editor = cb;
    } else if ((o && !o->choices.empty()) || f.name == QLatin1String("device") || isModel) {
        auto* combo = new QComboBox;
        // A long entry must not widen the dock (the section would scroll sideways).
        combo->setSizeAdjustPolicy(QComboBox::AdjustToMinimumContentsLengthWithIcon);
        combo->setMinimumContentsLength(10);
        // The cache name is checked by structure, so it may be typed; other lists are closed.
        combo->setEditable(f.name == QLatin1String("kv_cache.name") || isModel);  // models: also a folder or .gguf path
        if (isModel)
            combo->addItems(modelChoices());
        else if (o)
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
    auto* cell = new FieldCell;
    auto* v = new QVBoxLayout(cell);
    v->setContentsMargins(0, 0, 0, 0);
    v->setSpacing(1);
    v->addWidget(f.editor);
    if (f.name == QLatin1String("fidelity")) {
        // The switch states its cost where it is set.
        static_cast<QCheckBox*>(f.editor)->setText(tr("measure fidelity against the dense model"));
        auto* cost = new QLabel(tr("Costs a dense shadow cache and a reference pass per chunk (slower, more memory); "
                                   "reported apart from the policy's own time and memory."));
        cost->setObjectName("fidelityCost");
        cost->setWordWrap(true);
        cost->setEnabled(false);  // the palette's quieter text
        v->addWidget(cost);
    }
    v->addWidget(f.message);
    f.cell = cell;
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

QString RunForm::chosenPolicy() const {
    // The longest registry name that kv_cache.name starts with, followed by "-" or the end
    // (policy names may hold "-" themselves, e.g. smart-lastrec).
    const std::string name = value(QStringLiteral("kv_cache.name")).toStdString();
    std::string best;
    for (const std::string& p : kv_policy_names())
        if (name.compare(0, p.size(), p) == 0 && (name.size() == p.size() || name[p.size()] == '-') && p.size() > best.size()) best = p;
    return QString::fromStdString(best);
}

void RunForm::refreshPolicies() {
    if (!policy_) return;
    for (const PolicyInfo& p : policy_registry()) {
        const QString name = QString::fromStdString(p.name);
        if (policy_->findData(name) >= 0) continue;
        policy_->addItem(QStringLiteral("%1 — %2").arg(name, QString::fromStdString(p.summary)), name);
        policy_->setItemData(policy_->count() - 1, QString::fromStdString(p.summary), Qt::ToolTipRole);
    }
    syncPolicyCombo();
    revalidate();
}

void RunForm::syncPolicyCombo() {
    if (!policy_) return;
    const int i = policy_->findData(chosenPolicy());
    if (i != policy_->currentIndex()) policy_->setCurrentIndex(i);  // -1 shows the placeholder
}

void RunForm::placePolicyKnobs() {
    if (!policy_form_) return;
    const QString pol = chosenPolicy();
    if (pol == placed_for_ && policy_form_->rowCount() + advanced_form_->rowCount() > 0) return;
    placed_for_ = pol;
    const PolicyInfo* info = find_policy(pol.toStdString());
    const std::set<std::string> own = info ? policyKnobs(info) : std::set<std::string>{};
    // Out of both forms, then back in the option table's order; the widgets stay children of
    // the page throughout (no reparenting, so their visibility follows setRowVisible at once).
    for (auto& f : fields_) {
        if (!f.policyOwn || onTop(f.name)) continue;
        for (QFormLayout* form : {policy_form_, advanced_form_}) {
            int row = -1;
            QFormLayout::ItemRole role;
            form->getWidgetPosition(f.cell, &row, &role);
            if (row < 0) continue;
            const QFormLayout::TakeRowResult taken = form->takeRow(row);
            delete taken.labelItem;  // the layout items only: the label and cell widgets live on
            delete taken.fieldItem;
        }
    }
    int mine = 0;
    for (auto& f : fields_) {
        if (!f.policyOwn || onTop(f.name)) continue;
        const bool isOwn = own.count(f.name.toStdString()) > 0;
        QFormLayout* form = isOwn ? policy_form_ : advanced_form_;
        form->addRow(f.label, f.cell);
        form->setRowVisible(form->rowCount() - 1, isOwn || advanced_toggle_->isChecked());
        mine += isOwn;
    }
    policy_heading_->setText(info ? (mine ? tr("<b>%1's options</b>").arg(pol) : tr("<b>%1</b> has no options of its own").arg(pol))
                                  : tr("<b>Policy options</b>: no registry policy chosen"));
    advanced_toggle_->setText(tr("Advanced: the other policies' knobs (%1)").arg(advanced_form_->rowCount()));
}

void RunForm::revalidate() {
    if (loading_) return;
    placePolicyKnobs();
    syncPolicyCombo();
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
        if (auto* b = sections_->button(i)) b->setText(tabs_->tabText(i));
    }
    // A message on a folded knob unfolds it, so a problem is never hidden; the fold closes again
    // once the problems there are fixed, unless the person opened it.
    if (advanced_toggle_) {
        bool folded = false;
        for (const auto& f : fields_)
            folded |= messages.count(f.name) && advanced_form_->indexOf(f.cell) >= 0;
        if (folded && !advanced_toggle_->isChecked()) {
            advanced_toggle_->setChecked(true);
            advanced_opened_for_problem_ = true;
        } else if (!folded && advanced_opened_for_problem_) {
            advanced_toggle_->setChecked(false);
            advanced_opened_for_problem_ = false;
        }
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
