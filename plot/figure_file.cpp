// Figure files (see figure_file.h).
#include "figure_file.h"

#include <cairo-pdf.h>
#include <cairo-svg.h>

#include <cctype>
#include <cmath>
#include <memory>
#include <stdexcept>

namespace kv::plot {

std::string figure_format(const std::string& path) {
    const size_t dot = path.rfind('.');
    if (dot == std::string::npos) return "";
    std::string ext = path.substr(dot + 1);
    for (char& c : ext) c = char(std::tolower((unsigned char)c));
    return ext == "svg" || ext == "png" || ext == "pdf" ? ext : "";
}

void write_figure_file(const std::string& path, double width, double height, const std::function<void(cairo_t*)>& draw) {
    const std::string fmt = figure_format(path);
    cairo_surface_t* surface = nullptr;
    if (fmt == "svg") surface = cairo_svg_surface_create(path.c_str(), width, height);
    else if (fmt == "pdf") surface = cairo_pdf_surface_create(path.c_str(), width, height);
    else surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, int(std::ceil(width * 2)), int(std::ceil(height * 2)));
    std::unique_ptr<cairo_surface_t, void (*)(cairo_surface_t*)> keep(surface, cairo_surface_destroy);
    const auto fail = [&](const char* what, cairo_status_t st) {
        throw std::runtime_error("figure '" + path + "': " + what + " (" + cairo_status_to_string(st) + ")");
    };
    if (cairo_surface_status(surface) != CAIRO_STATUS_SUCCESS) fail("cannot create it", cairo_surface_status(surface));
    cairo_t* cr = cairo_create(surface);
    if (fmt == "png") cairo_scale(cr, 2, 2);  // 144 dpi
    try {
        draw(cr);
    } catch (...) {
        cairo_destroy(cr);
        throw;
    }
    const cairo_status_t st = cairo_status(cr);
    cairo_destroy(cr);
    if (st != CAIRO_STATUS_SUCCESS) fail("drawing failed", st);
    if (fmt == "png") {
        const cairo_status_t w = cairo_surface_write_to_png(surface, path.c_str());
        if (w != CAIRO_STATUS_SUCCESS) fail("cannot write it", w);
    }
    cairo_surface_finish(surface);
    if (cairo_surface_status(surface) != CAIRO_STATUS_SUCCESS) fail("cannot write it", cairo_surface_status(surface));
}

void text_at(cairo_t* cr, const std::string& s, double x, double y, double align_x, double align_y) {
    cairo_text_extents_t e;
    cairo_text_extents(cr, s.c_str(), &e);
    cairo_move_to(cr, x - e.x_bearing - align_x * e.width, y - e.y_bearing - align_y * e.height);
    cairo_show_text(cr, s.c_str());
}

}  // namespace kv::plot
