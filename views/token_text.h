// Token text for the views: a run's evaluated samples (token ids and the tokenizer's pieces,
// from the session's sample_tokens table), the hover line "token 'text' (id N)", and a search
// that marks every position of a token id or a string. A string matches the text the pieces
// spell back to back, so one spanning several tokens marks each token it overlaps.
// Shared by the eviction map and the scores view; reads storage rows only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "storage/rows.h"
#include "views/colormap.h"
#include "views/plot_util.h"

namespace kv::storage {
class SessionReader;
}

namespace kv::views {

struct RunTokens {
    int64_t run = 0;
    std::vector<storage::SampleTokensRow> samples;  // in arrival order (sample index order)
    int64_t last_id = 0;
    uint64_t version = 0;
    // Sample `index` (the eviction map's sequence), nullptr when it was not recorded.
    const storage::SampleTokensRow* sample(int64_t index) const;
};
// Reads the run's samples newer than what `t` holds. Returns true when any arrived.
bool refresh_run_tokens(RunTokens& t, storage::SessionReader& reader);

// A piece as one printable line: quoted, newline/tab/CR and other control bytes escaped
// (\n, \t, \r, \xNN), bytes that are not valid UTF-8 as \xNN.
std::string printable_piece(const std::string& piece);
// "'piece' (id N)" for position `pos` of `sample`, "" when out of range or not recorded.
std::string token_label(const storage::SampleTokensRow* sample, int64_t pos);

// Positions a query marks in one sample. Query "#N": every position whose id is N. Any other
// query: every occurrence of the text in the concatenated pieces (occurrences may overlap);
// each marks every token whose bytes it overlaps. `matches` counts occurrences (for an id,
// positions), `positions` is sorted and unique.
struct TokenMatches {
    int64_t matches = 0;
    std::vector<int64_t> positions;
};
TokenMatches find_token_matches(const storage::SampleTokensRow& sample, const std::string& query);

// The search box's state (one per view).
struct TokenSearch {
    char query[128] = {0};
    // What the marks were computed for; recomputed when the query, sample or data change.
    std::string applied;
    int64_t applied_sample = -1;
    uint64_t applied_version = 0;
    TokenMatches result;
    bool active() const { return query[0] != 0; }
    // Position is marked (binary search of result.positions).
    bool marked(int64_t pos) const;
};
// Recomputes `s.result` when needed for `sample` of `tokens`.
void update_token_search(TokenSearch& s, const RunTokens& tokens, int64_t sample);
// Search box and match count on one line (the caller's toolbar). `sample` is the shown one.
void DrawTokenSearchBox(TokenSearch& s, const RunTokens& tokens, int64_t sample, float width = 180);

// Pink: apart from every colour of the maps (the sequential colour map runs purple to yellow).
constexpr Colour kSearchMarkColour = IM_COL32(255, 70, 170, 240);

}  // namespace kv::views
