// The view table: every view listed once, each making its own slot, and the canvas' rules for
// several runs read from the entries (no view is named in the canvas).
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>

#include "views/canvas.h"
#include "views/canvas_impl.h"
#include "views/compare_view.h"
#include "views/view_table.h"

namespace kv::views {
namespace {

TEST(ViewTable, NamesAreUniqueAndEachEntryMakesItsOwnSlot) {
    std::set<std::string> names;
    int comparison_views = 0;
    ASSERT_EQ(view_count(), view_table().size());
    for (size_t k = 0; k < view_count(); ++k) {
        const ViewEntry& e = view_entry(ViewKind(k));
        EXPECT_TRUE(names.insert(e.name).second) << "two views named " << e.name;
        ASSERT_NE(e.make, nullptr) << e.name;
        EXPECT_NE(e.make(), nullptr) << e.name;
        ViewKind back;
        ASSERT_TRUE(view_from_name(e.name, &back));
        EXPECT_EQ(back, ViewKind(k));
        EXPECT_EQ(view_named(e.name), ViewKind(k));
        if (e.min_runs >= 2) {
            ++comparison_views;
            EXPECT_TRUE(e.several_runs) << e.name << " needs several runs, so it shows them";
        }
    }
    EXPECT_EQ(comparison_views, 1) << "selecting several runs moves to exactly one comparison view";
    EXPECT_FALSE(view_shows_several(ViewKind(0))) << "the default view shows the selected run";
    EXPECT_THROW(view_named("no such view"), std::logic_error);
    EXPECT_FALSE(view_from_name("no such view", nullptr));
}

TEST(ViewTable, ACanvasHoldsOneStateOfEachViewAndFindsItByType) {
    Canvas canvas(nullptr);
    CanvasImpl& c = canvas.impl();
    ASSERT_EQ(c.slots.size(), view_count());
    CompareViewState& a = c.state<CompareViewState>();
    CompareViewState& b = c.state<CompareViewState>();
    EXPECT_EQ(&a, &b);
    EXPECT_THROW(c.state<int>(), std::logic_error);
}

}  // namespace
}  // namespace kv::views
