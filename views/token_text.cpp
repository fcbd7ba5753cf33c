// Token text and search (see token_text.h).
#include "views/token_text.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "storage/session_reader.h"

namespace kv::views {

const storage::SampleTokensRow* RunTokens::sample(int64_t index) const {
    // Samples arrive in index order, so the index is usually the position.
    if (index >= 0 && size_t(index) < samples.size() && samples[size_t(index)].sample == index) return &samples[size_t(index)];
    for (const auto& s : samples)
        if (s.sample == index) return &s;
    return nullptr;
}

bool refresh_run_tokens(RunTokens& t, storage::SessionReader& reader) {
    std::vector<storage::SampleTokensRow> rows = reader.sample_tokens(t.run, t.last_id);
    for (auto& r : rows) {
        t.last_id = std::max(t.last_id, r.id);
        t.samples.push_back(std::move(r));
    }
    if (!rows.empty()) ++t.version;
    return !rows.empty();
}

namespace {
// Length of the valid UTF-8 sequence starting at p (1..4), 0 when it is not one.
int utf8_length(const unsigned char* p, size_t left) {
    int n = p[0] < 0x80 ? 1 : (p[0] >> 5) == 0x6 ? 2 : (p[0] >> 4) == 0xe ? 3 : (p[0] >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || size_t(n) > left) return 0;
    for (int i = 1; i < n; ++i)
        if ((p[i] & 0xc0) != 0x80) return 0;
    return n;
}
}  // namespace

std::string printable_piece(const std::string& piece) {
    std::string out = "'";
    const auto* p = reinterpret_cast<const unsigned char*>(piece.data());
    for (size_t i = 0; i < piece.size();) {
        const unsigned char c = p[i];
        const int n = utf8_length(p + i, piece.size() - i);
        char buf[8];
        if (c == '\n') out += "\\n", ++i;
        else if (c == '\t') out += "\\t", ++i;
        else if (c == '\r') out += "\\r", ++i;
        else if (c == '\\') out += "\\\\", ++i;
        else if (n == 0 || (n == 1 && c < 0x20) || c == 0x7f) {
            std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(c));
            out += buf, ++i;
        } else {
            out.append(piece, i, size_t(n));
            i += size_t(n);
        }
    }
    return out + "'";
}

std::string token_label(const storage::SampleTokensRow* sample, int64_t pos) {
    if (!sample || pos < 0 || size_t(pos) >= sample->ids.size()) return "";
    const std::string text = size_t(pos) < sample->pieces.size() ? printable_piece(sample->pieces[size_t(pos)]) : "(no text)";
    return text + " (id " + std::to_string(sample->ids[size_t(pos)]) + ")";
}

TokenMatches find_token_matches(const storage::SampleTokensRow& sample, const std::string& query) {
    TokenMatches m;
    if (query.empty()) return m;
    if (query.size() > 1 && query[0] == '#') {
        char* end = nullptr;
        const long long id = std::strtoll(query.c_str() + 1, &end, 10);
        if (end && *end == 0) {
            for (size_t p = 0; p < sample.ids.size(); ++p)
                if (sample.ids[p] == id) m.positions.push_back(int64_t(p));
            m.matches = int64_t(m.positions.size());
            return m;
        }
    }
    // The sample's text with each byte's token: an occurrence [b, e) marks tokens of bytes b..e-1.
    std::string text;
    std::vector<int64_t> token_of_byte;
    for (size_t p = 0; p < sample.pieces.size(); ++p) {
        text += sample.pieces[p];
        token_of_byte.resize(text.size(), int64_t(p));
    }
    std::vector<char> marked(sample.pieces.size(), 0);
    for (size_t at = text.find(query); at != std::string::npos; at = text.find(query, at + 1)) {
        ++m.matches;
        for (size_t b = at; b < at + query.size(); ++b) marked[size_t(token_of_byte[b])] = 1;
    }
    for (size_t p = 0; p < marked.size(); ++p)
        if (marked[p]) m.positions.push_back(int64_t(p));
    return m;
}

bool TokenSearch::marked(int64_t pos) const {
    return std::binary_search(result.positions.begin(), result.positions.end(), pos);
}

void update_token_search(TokenSearch& s, const RunTokens& tokens, int64_t sample) {
    if (s.applied == s.query && s.applied_sample == sample && s.applied_version == tokens.version) return;
    s.applied = s.query;
    s.applied_sample = sample;
    s.applied_version = tokens.version;
    s.result = {};
    if (const storage::SampleTokensRow* row = tokens.sample(sample); row && s.active()) s.result = find_token_matches(*row, s.applied);
}

void DrawTokenSearchBox(TokenSearch& s, const RunTokens& tokens, int64_t sample, float width) {
    const storage::SampleTokensRow* row = tokens.sample(sample);
    // The box and its count ("12 matches, 14 tokens") on this line only if they fit.
    if (ImGui::GetContentRegionAvail().x < width + ImGui::CalcTextSize("000 matches, 000 tokens").x) ImGui::NewLine();
    ImGui::SetNextItemWidth(width);
    ImGui::InputTextWithHint("##token_search", "find token or text (#id)", s.query, sizeof s.query);
    if (ImGui::IsItemHovered())
        ImGui::SetTooltip("Marks every position of a string in the sample's text (a string over several tokens marks each "
                          "of them), or of a token id written #id.");
    update_token_search(s, tokens, sample);
    ImGui::SameLine();
    if (!row) ImGui::TextDisabled("(no token text recorded for this sample)");
    else if (!s.active()) ImGui::TextDisabled("%zu tokens", row->ids.size());
    else if (s.result.matches == 0) ImGui::TextColored(ImVec4(1, 0.6f, 0.4f, 1), "no match");
    else
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kSearchMarkColour), "%lld match%s, %zu token%s",
                           (long long)s.result.matches, s.result.matches == 1 ? "" : "es", s.result.positions.size(),
                           s.result.positions.size() == 1 ? "" : "s");
}

}  // namespace kv::views
