// Compare-policies dialog (see compare_dialog.h).
#include "compare_dialog.h"

#include <QComboBox>
#include <algorithm>
#include <QDialogButtonBox>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QRegularExpression>
#include <QListWidget>
#include <QPushButton>
#include <QVBoxLayout>

#include "engine/core/error.h"
#include "engine/kv/kv_config.h"

namespace kv::gui {

bool parseCacheLengths(const QString& text, std::vector<int64_t>* out, QString* problem) {
    out->clear();
    for (const QString& part : text.split(QRegularExpression("[,\\s]+"), Qt::SkipEmptyParts)) {
        bool ok = false;
        const qlonglong v = part.toLongLong(&ok);
        if (!ok || v <= 0) {
            if (problem) *problem = QObject::tr("cache lengths: '%1' is not a positive whole number; expected lengths like 256, 512").arg(part);
            return false;
        }
        if (std::find(out->begin(), out->end(), int64_t(v)) == out->end()) out->push_back(int64_t(v));
    }
    if (out->empty()) {
        if (problem) *problem = QObject::tr("cache lengths: none given; expected lengths like 256, 512");
        return false;
    }
    return true;
}

std::vector<RunConfig> compareConfigs(const RunConfig& base, const QStringList& policies, const QStringList& buffers,
                                      CompareReference reference, const std::vector<int64_t>& cache_lengths) {
    std::vector<RunConfig> out;
    if (policies.isEmpty() || buffers.isEmpty()) return out;
    RunConfig ref = base;
    if (reference == CompareReference::DENSE) {
        ref.kv_cache.name = "dense-default";
        ref.kv_cache.cache_length = 0;
        ref.name = "dense (reference)";
    } else {
        ref.kv_cache.name = str(policies.front().toStdString(), "-", buffers.front().toStdString());
        ref.kv_cache.cache_length = base.data.seq_length;
        ref.name = str(ref.kv_cache.name, " L=", ref.kv_cache.cache_length, " (reference)");
    }
    const std::vector<int64_t> lengths = cache_lengths.empty() ? std::vector<int64_t>{base.kv_cache.cache_length} : cache_lengths;
    // The reference steps through the sequence in the compared runs' chunks (their prefill is
    // their cache length), so its speed and its per-chunk numbers compare step for step.
    ref.driver.prefill_length = *std::min_element(lengths.begin(), lengths.end());
    out.push_back(ref);
    for (const auto& p : policies)
        for (const auto& b : buffers)
            for (int64_t L : lengths) {
                RunConfig c = base;
                c.kv_cache.name = str(p.toStdString(), "-", b.toStdString());
                c.kv_cache.cache_length = L;
                c.name = str(c.kv_cache.name, " L=", c.kv_cache.cache_length);
                out.push_back(c);
            }
    return out;
}

CompareDialog::CompareDialog(const RunConfig& base, QWidget* parent) : QDialog(parent), base_(base) {
    setWindowTitle(tr("Compare policies"));
    auto* top = new QVBoxLayout(this);
    auto* intro = new QLabel(tr("One run per policy and buffer below, everything else as in the form "
                                "(cache length %1, chunk size %2, %3 tokens of %4), plus a reference run.")
                                 .arg(base.kv_cache.cache_length)
                                 .arg(base.driver.chunk_size)
                                 .arg(base.data.seq_length)
                                 .arg(QString::fromStdString(base.data.name)));
    intro->setWordWrap(true);
    top->addWidget(intro);

    auto* lists = new QHBoxLayout;
    auto makeList = [](const std::vector<std::string>& names, const QString& objectName) {
        auto* l = new QListWidget;
        l->setObjectName(objectName);
        for (const auto& n : names) {
            if (n == "dense") continue;  // the dense run is the reference option
            auto* item = new QListWidgetItem(QString::fromStdString(n), l);
            item->setFlags(item->flags() | Qt::ItemIsUserCheckable);
            item->setCheckState(Qt::Unchecked);
        }
        return l;
    };
    policies_ = makeList(kv_policy_names(), "comparePolicies");
    buffers_ = makeList(kv_buffer_names(), "compareBuffers");
    auto* pcol = new QVBoxLayout;
    pcol->addWidget(new QLabel(tr("Policies")));
    pcol->addWidget(policies_);
    auto* bcol = new QVBoxLayout;
    bcol->addWidget(new QLabel(tr("Buffers")));
    bcol->addWidget(buffers_);
    lists->addLayout(pcol);
    lists->addLayout(bcol);
    top->addLayout(lists, 1);

    auto* form = new QFormLayout;
    reference_ = new QComboBox;
    reference_->setObjectName("compareReference");
    reference_->addItem(tr("dense (the whole sequence in the cache)"));
    reference_->addItem(tr("large cache (first policy, cache length = sequence length)"));
    form->addRow(tr("Reference"), reference_);
    lengths_ = new QLineEdit(QString::number(base.kv_cache.cache_length));
    lengths_->setObjectName("compareCacheLengths");
    lengths_->setToolTip(tr("One length: a comparison. Several (\"256, 512, 1024\"): a sweep over cache sizes, "
                            "shown as quality-vs-cache-size curves in the sweep view."));
    form->addRow(tr("Cache lengths"), lengths_);
    top->addLayout(form);

    summary_ = new QLabel;
    summary_->setWordWrap(true);
    top->addWidget(summary_);
    buttons_ = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel);
    buttons_->button(QDialogButtonBox::Ok)->setText(tr("Launch"));
    top->addWidget(buttons_);
    connect(buttons_, &QDialogButtonBox::accepted, this, &QDialog::accept);
    connect(buttons_, &QDialogButtonBox::rejected, this, &QDialog::reject);
    connect(policies_, &QListWidget::itemChanged, this, &CompareDialog::update);
    connect(buffers_, &QListWidget::itemChanged, this, &CompareDialog::update);
    connect(reference_, qOverload<int>(&QComboBox::currentIndexChanged), this, &CompareDialog::update);
    connect(lengths_, &QLineEdit::textChanged, this, &CompareDialog::update);

    // Start from the form's policy and the classic trio, in the form's buffer.
    QStringList pol = {"h2o", "lastrec", "streaming"};
    const QString own = QString::fromStdString(base.kv_cache.policy());
    if (own != "dense" && !pol.contains(own)) pol.prepend(own);
    setSelection(pol, {QString::fromStdString(base.kv_cache.buffer())}, CompareReference::DENSE);
    resize(560, 480);
}

void CompareDialog::setSelection(const QStringList& policies, const QStringList& buffers, CompareReference reference) {
    const QSignalBlocker b1(policies_), b2(buffers_), b3(reference_);
    for (int i = 0; i < policies_->count(); ++i)
        policies_->item(i)->setCheckState(policies.contains(policies_->item(i)->text()) ? Qt::Checked : Qt::Unchecked);
    for (int i = 0; i < buffers_->count(); ++i)
        buffers_->item(i)->setCheckState(buffers.contains(buffers_->item(i)->text()) ? Qt::Checked : Qt::Unchecked);
    reference_->setCurrentIndex(reference == CompareReference::DENSE ? 0 : 1);
    update();
}

QStringList CompareDialog::policies() const {
    QStringList out;
    for (int i = 0; i < policies_->count(); ++i)
        if (policies_->item(i)->checkState() == Qt::Checked) out << policies_->item(i)->text();
    return out;
}

QStringList CompareDialog::buffers() const {
    QStringList out;
    for (int i = 0; i < buffers_->count(); ++i)
        if (buffers_->item(i)->checkState() == Qt::Checked) out << buffers_->item(i)->text();
    return out;
}

CompareReference CompareDialog::reference() const {
    return reference_->currentIndex() == 0 ? CompareReference::DENSE : CompareReference::LARGE_CACHE;
}

std::vector<int64_t> CompareDialog::cacheLengths() const {
    std::vector<int64_t> out;
    if (!parseCacheLengths(lengths_->text(), &out, nullptr)) out = {base_.kv_cache.cache_length};
    return out;
}

void CompareDialog::setCacheLengths(const QString& text) { lengths_->setText(text); }

std::vector<RunConfig> CompareDialog::configs() const {
    return compareConfigs(base_, policies(), buffers(), reference(), cacheLengths());
}

void CompareDialog::update() {
    const auto cfgs = configs();
    problems_.clear();
    std::vector<int64_t> lengths;
    QString lengthProblem;
    if (!parseCacheLengths(lengths_->text(), &lengths, &lengthProblem)) problems_ << lengthProblem;
    for (const auto& c : cfgs)
        for (const auto& p : run_config_problems(c)) problems_ << QString::fromStdString(c.kv_cache.name + ": " + p);
    if (cfgs.empty()) problems_ << tr("choose at least one policy and one buffer");
    else if (lengths.size() <= 1 && cfgs.size() > 8) problems_ << tr("%1 runs: the compare view shows at most 8; choose fewer").arg(cfgs.size());
    else if (cfgs.size() > kMaxCompareLaunch)
        problems_ << tr("%1 runs: a sweep from this dialog launches at most %2 (kvlab sweep takes any grid); choose fewer")
                         .arg(cfgs.size())
                         .arg(kMaxCompareLaunch);
    summary_->setStyleSheet(problems_.isEmpty() ? QString() : QStringLiteral("color: #d03030;"));
    summary_->setText(problems_.isEmpty() ? (lengths.size() > 1 ? tr("%1 runs will be launched (reference first): a sweep over %2 cache "
                                                                      "lengths, shown in the sweep view.")
                                                                       .arg(cfgs.size())
                                                                       .arg(lengths.size())
                                                                 : tr("%1 runs will be launched (reference first).").arg(cfgs.size()))
                                          : problems_.join('\n'));
    buttons_->button(QDialogButtonBox::Ok)->setEnabled(problems_.isEmpty());
}

}  // namespace kv::gui
