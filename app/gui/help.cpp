// Help dialogs (see help.h).
#include "help.h"

#include <QAction>
#include <QCoreApplication>
#include <QDialog>
#include <QDialogButtonBox>
#include <QDir>
#include <QFileInfo>
#include <QMenu>
#include <QMenuBar>
#include <QTextBrowser>
#include <QUrl>
#include <QVBoxLayout>

#include "views/canvas.h"

namespace kv::gui {

namespace {
QString plain(QString menuText) {
    menuText.remove('&');
    return menuText;
}

// Every action with a shortcut, depth first through the menus, as (path, keys).
void collect(const QMenu* menu, const QString& path, QList<QPair<QString, QString>>& out) {
    for (const QAction* a : menu->actions()) {
        if (a->isSeparator()) continue;
        const QString here = path + QStringLiteral(" > ") + plain(a->text());
        if (a->menu()) {
            collect(a->menu(), here, out);
            continue;
        }
        QStringList keys;
        for (const QKeySequence& k : a->shortcuts()) keys << k.toString(QKeySequence::NativeText);
        if (!keys.isEmpty()) out.append({here, keys.join(QStringLiteral(", "))});
    }
}
}  // namespace

QString shortcutSheetHtml(const QMenuBar* menus) {
    QList<QPair<QString, QString>> rows;
    if (menus)
        for (const QAction* a : menus->actions())
            if (a->menu()) collect(a->menu(), plain(a->text()), rows);
    QString html = QStringLiteral("<h3>Keyboard</h3><table cellspacing=0 cellpadding=3>");
    for (const auto& [what, keys] : rows)
        html += QStringLiteral("<tr><td><b>%1</b></td><td>%2</td></tr>").arg(keys.toHtmlEscaped(), what.toHtmlEscaped());
    // The runs table's keys and clicks live on the table, not in a menu.
    html += QStringLiteral("</table><h3>In the runs table</h3><table cellspacing=0 cellpadding=3>");
    const char* const table[][2] = {{"F2", "edit the name or notes of the current cell's run"},
                                    {"Del", "delete the selected runs (asks first; other runs are untouched)"},
                                    {"double click", "load the run's configuration into the Run form"},
                                    {"right click", "run again, rename, notes, cancel, delete"},
                                    {"right click on the header", "show or hide any column, every summary number included"}};
    for (const auto& [keys, what] : table)
        html += QStringLiteral("<tr><td><b>%1</b></td><td>%2</td></tr>").arg(QString::fromLatin1(keys), QString::fromLatin1(what));
    html += QStringLiteral("</table><h3>Mouse, in the views</h3><table cellspacing=0 cellpadding=3>");
    for (const auto& g : views::canvas_gestures())
        html += QStringLiteral("<tr><td><b>%1</b></td><td>%2</td><td><i>%3</i></td></tr>")
                    .arg(QString::fromUtf8(g.input).toHtmlEscaped(), QString::fromUtf8(g.action).toHtmlEscaped(),
                         QString::fromUtf8(g.where).toHtmlEscaped());
    html += QStringLiteral("</table>");
    return html;
}

QDialog* makeShortcutDialog(const QMenuBar* menus, QWidget* parent) {
    auto* d = new QDialog(parent);
    d->setObjectName("shortcutDialog");
    d->setWindowTitle(QObject::tr("Keyboard shortcuts"));
    auto* v = new QVBoxLayout(d);
    auto* text = new QTextBrowser;
    text->setObjectName("shortcutText");
    text->setHtml(shortcutSheetHtml(menus));
    v->addWidget(text);
    auto* buttons = new QDialogButtonBox(QDialogButtonBox::Close);
    QObject::connect(buttons, &QDialogButtonBox::rejected, d, &QDialog::reject);
    v->addWidget(buttons);
    d->resize(640, 520);
    d->setAttribute(Qt::WA_DeleteOnClose);
    return d;
}

QString findUserGuide() {
    QStringList candidates;
    const QString env = qEnvironmentVariable("KVLAB_GUIDE");
    if (!env.isEmpty()) candidates << env;
    const QString bin = QCoreApplication::applicationDirPath();
    if (!bin.isEmpty()) candidates << QDir(bin).filePath(QStringLiteral("../share/doc/kvlab/GUIDE.md"));
#ifdef KVLAB_SOURCE_DIR
    candidates << QStringLiteral(KVLAB_SOURCE_DIR "/docs/GUIDE.md");
#endif
    for (const QString& c : candidates)
        if (QFileInfo(c).isFile()) return QFileInfo(c).canonicalFilePath();
    return {};
}

QDialog* makeUserGuideDialog(QWidget* parent, QString* error) {
    const QString path = findUserGuide();
    if (path.isEmpty()) {
        if (error)
            *error = QObject::tr("the user guide (docs/GUIDE.md) was not found; expected it in $KVLAB_GUIDE, in "
                                 "<prefix>/share/doc/kvlab/ or in the source tree");
        return nullptr;
    }
    auto* d = new QDialog(parent);
    d->setObjectName("guideDialog");
    d->setWindowTitle(QObject::tr("kvlab user guide"));
    auto* v = new QVBoxLayout(d);
    auto* text = new QTextBrowser;
    text->setObjectName("guideText");
    text->setOpenExternalLinks(true);
    // Relative image links (../assets/screenshots/...) resolve against the guide's folder.
    text->setSearchPaths({QFileInfo(path).absolutePath()});
    text->setSource(QUrl::fromLocalFile(path), QTextDocument::MarkdownResource);
    v->addWidget(text);
    auto* buttons = new QDialogButtonBox(QDialogButtonBox::Close);
    QObject::connect(buttons, &QDialogButtonBox::rejected, d, &QDialog::reject);
    v->addWidget(buttons);
    d->resize(900, 800);
    d->setAttribute(Qt::WA_DeleteOnClose);
    if (text->document()->isEmpty()) {
        if (error) *error = QObject::tr("could not read the user guide %1").arg(path);
        delete d;
        return nullptr;
    }
    return d;
}

}  // namespace kv::gui
