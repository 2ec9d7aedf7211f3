// Note [Options and stats fields] (include/teraio/session.h): the field lists cover every field of
// SessionOptions, SessionStats and SessionTierStats, once each, in declaration order. A field added
// to a struct but not to its list fails here (the count of an aggregate's fields is taken by
// brace-initialising it with ever more arguments).
#include <gtest/gtest.h>

#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include "teraio/session.h"

namespace teraio {
namespace {

struct AnyField {
  template <class T>
  operator T() const;  // never called: only for the aggregate's initialisation to compile
};

template <class T, class... Fields>
constexpr size_t count_fields() {
  if constexpr (requires { T{Fields{}..., AnyField{}}; })
    return count_fields<T, Fields..., AnyField>();
  else
    return sizeof...(Fields);
}

template <class Struct, class Visit>
std::vector<std::string> names(Visit visit) {
  std::vector<std::string> out;
  visit([&](const char* name, auto member, auto...) {
    static_assert(std::is_member_object_pointer_v<decltype(member)>);
    out.push_back(name);
  });
  return out;
}

void expect_unique(const std::vector<std::string>& v) {
  EXPECT_EQ(std::set<std::string>(v.begin(), v.end()).size(), v.size()) << "a name twice";
}

TEST(Fields, EverySessionOptionIsListed) {
  const auto v = names<SessionOptions>([](auto f) { for_each_option_field(f); });
  EXPECT_EQ(v.size(), count_fields<SessionOptions>());
  expect_unique(v);
  EXPECT_EQ(v.front(), "budget_bytes");
}

TEST(Fields, EverySessionStatIsListed) {
  const auto v = names<SessionStats>([](auto f) { for_each_stats_field(f); });
  EXPECT_EQ(v.size(), count_fields<SessionStats>());
  expect_unique(v);
  EXPECT_EQ(v.back(), "tiers");
}

TEST(Fields, EveryTierStatIsListed) {
  const auto v = names<SessionTierStats>([](auto f) { for_each_tier_stats_field(f); });
  EXPECT_EQ(v.size(), count_fields<SessionTierStats>());
  expect_unique(v);
}

TEST(Fields, CountersAreNumbers) {
  for_each_stats_field([](const char* name, auto member, StatKind kind) {
    using T = std::decay_t<decltype(SessionStats{}.*member)>;
    if (kind == StatKind::kCounter) {
      EXPECT_TRUE(std::is_arithmetic_v<T>) << name;
    }
  });
}

// The counting itself: a field more is seen.
struct Two {
  int a = 0;
  std::string b;
};
struct Three {
  int a = 0;
  std::string b;
  std::vector<int> c;
};
static_assert(count_fields<Two>() == 2);
static_assert(count_fields<Three>() == 3);

}  // namespace
}  // namespace teraio
