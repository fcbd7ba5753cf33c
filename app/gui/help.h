// Help: the keyboard-shortcut sheet (every menu action that has a shortcut, read from the menus
// themselves, plus the views' mouse gestures) and the user guide (docs/GUIDE.md shown as
// Markdown with its screenshots). Builds dialogs; holds no state and runs nothing.
#pragma once

#include <QString>

class QDialog;
class QMenuBar;
class QWidget;

namespace kv::gui {

// The sheet as HTML: one row per shortcut ("File > Open session…", "Ctrl+O") and per gesture.
QString shortcutSheetHtml(const QMenuBar* menus);
QDialog* makeShortcutDialog(const QMenuBar* menus, QWidget* parent);

// Where docs/GUIDE.md is: $KVLAB_GUIDE, then <prefix>/share/doc/kvlab/GUIDE.md next to an
// installed binary, then the source tree the app was built from. Empty when none exists.
QString findUserGuide();
// A window showing the guide (images resolved beside it); nullptr with `error` set when the
// guide cannot be found or read.
QDialog* makeUserGuideDialog(QWidget* parent, QString* error);

}  // namespace kv::gui
