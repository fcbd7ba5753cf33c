// Progress bar / plain progress lines (see progress.h).
#include "progress.h"

#include <unistd.h>

namespace kv::cli {

Progress::Progress(std::string title, FILE* out)
    : title_(std::move(title)), out_(out), tty_(isatty(fileno(out)) != 0), start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { finish(); }

void Progress::update(long long done, long long total, const std::string& what) {
    auto now = std::chrono::steady_clock::now();
    double elapsed = std::chrono::duration<double>(now - start_).count();
    if (tty_) {
        // Redraw at most 20 times a second.
        if (done < total && now - last_draw_ < std::chrono::milliseconds(50)) return;
        last_draw_ = now;
        const int width = 28;
        int fill = total > 0 ? int(double(done) / double(total) * width) : 0;
        std::string bar(size_t(fill), '#');
        bar.resize(width, '.');
        double eta = done > 0 && total > done ? elapsed / double(done) * double(total - done) : 0;
        std::fprintf(out_, "\r\033[K%s [%s] %lld/%lld %5.1fs", title_.c_str(), bar.c_str(), done, total, elapsed);
        if (eta > 0) std::fprintf(out_, " eta %.0fs", eta);
        if (!what.empty()) std::fprintf(out_, "  %s", what.c_str());
        std::fflush(out_);
    } else {
        // Logs: one line per second at most (and the last step), so files stay readable.
        if (done < total && last_draw_.time_since_epoch().count() && now - last_draw_ < std::chrono::seconds(1)) return;
        last_draw_ = now;
        std::fprintf(out_, "%s [%lld/%lld %.1fs] %s\n", title_.c_str(), done, total, elapsed, what.c_str());
        std::fflush(out_);
    }
}

void Progress::finish() {
    if (finished_) return;
    finished_ = true;
    if (tty_) {
        std::fprintf(out_, "\r\033[K");
        std::fflush(out_);
    }
}

}  // namespace kv::cli
