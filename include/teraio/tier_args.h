// The tier spec syntax that every command (`plan`, `exact`, `study`, `train`) and the Python
// package (teraio.parse_tiers) share, parsed in one place (docs/formats.md, "Tier specs"):
//   [NAME=]host:CAPACITY[:READ_GBPS:WRITE_GBPS[:BOTH_GBPS]]
//   [NAME=]file:DIR[,DIR...]:CAPACITY[:READ_GBPS:WRITE_GBPS[:BOTH_GBPS]]
//   NAME:CAPACITY:READ_GBPS:WRITE_GBPS       the planner's first form, still accepted
// A list separates specs with commas; a file tier's directory list ends at its ':'.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace teraio {

struct TierArg {
  // kNamed: the NAME:CAPACITY:READ_GBPS:WRITE_GBPS form, which says nothing of the storage.
  enum class Kind : uint8_t { kHost, kFile, kNamed };
  Kind kind = Kind::kNamed;
  std::string name;                // NAME when given, else "host" or "file"
  bool name_given = false;         // NAME= was written (or the NAME: of the kNamed form)
  std::vector<std::string> paths;  // kFile: the directories, in order
  uint64_t capacity_bytes = 0;     // > 0
  double read_gbps = 0;            // GB/s (1e9 bytes/s), > 0 when given; 0: not given
  double write_gbps = 0;
  double duplex_gbps = 0;          // BOTH_GBPS: per direction while both move; 0: not given
  std::string text;  // the spec as written, for messages

  bool bandwidths_given() const { return read_gbps > 0; }
};

// Parses one spec. Throws teraio::Error, one line naming `what` (e.g. "--tier") and the text.
TierArg parse_tier_arg(std::string_view text, std::string_view what = "--tier");
// Parses a comma-separated list of specs (one spec is a list of one).
std::vector<TierArg> parse_tier_arg_list(std::string_view text, std::string_view what = "--tier");
// Throws unless `tier` can be opened by a Session: a host or file tier named after its kind (the
// Session names its tiers "host" and "file").
void check_session_tier(const TierArg& tier, std::string_view what = "--tier");

}  // namespace teraio
