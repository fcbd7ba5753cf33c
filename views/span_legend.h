// A legend of span categories that toggles them: one swatch and name per category present,
// click to hide or show it (hidden ones dimmed). Shared by the views that draw spans so a
// category's colour and its switch look the same everywhere.
#pragma once

#include <cstdint>
#include <vector>

#include "storage/rows.h"

namespace kv::views {

// Bit c of a mask = SpanCategory c hidden.
inline bool span_category_hidden(uint32_t hidden, trace::SpanCategory c) { return (hidden >> unsigned(c)) & 1u; }
inline void toggle_span_category(uint32_t& hidden, trace::SpanCategory c) { hidden ^= 1u << unsigned(c); }

// Draws the legend on the current line(s); returns true when a click changed `hidden`.
bool draw_span_legend(uint32_t& hidden, const std::vector<trace::SpanCategory>& present);

}  // namespace kv::views
