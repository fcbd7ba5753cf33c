// Span category legend with toggles (see span_legend.h).
#include "views/span_legend.h"

#include <imgui.h>

#include "views/colormap.h"

namespace kv::views {

static_assert(trace::kNumSpanCategories <= 32, "the hidden-category mask is 32 bits");

bool draw_span_legend(uint32_t& hidden, const std::vector<trace::SpanCategory>& present) {
    bool changed = false;
    for (trace::SpanCategory c : present) {
        const bool off = span_category_hidden(hidden, c);
        ImGui::PushID(int(c));
        const Colour col = off ? with_alpha(span_category_colour(c), 60) : span_category_colour(c);
        if (ImGui::ColorButton("##swatch", ImGui::ColorConvertU32ToFloat4(col), ImGuiColorEditFlags_NoTooltip, ImVec2(10, 10))) {
            toggle_span_category(hidden, c);
            changed = true;
        }
        ImGui::SameLine(0, 3);
        if (off) ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
        if (ImGui::Selectable(trace::span_category_name(c), false, 0, ImGui::CalcTextSize(trace::span_category_name(c)))) {
            toggle_span_category(hidden, c);
            changed = true;
        }
        if (off) ImGui::PopStyleColor();
        if (ImGui::IsItemHovered()) ImGui::SetTooltip("click: %s %s spans", off ? "show" : "hide", trace::span_category_name(c));
        ImGui::PopID();
        // Wrap before an entry that would not fit.
        const float next = ImGui::GetItemRectMax().x + 80;
        if (next < ImGui::GetWindowPos().x + ImGui::GetContentRegionMax().x) ImGui::SameLine();
    }
    ImGui::NewLine();
    return changed;
}

}  // namespace kv::views
