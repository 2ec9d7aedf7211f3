// The tier spec syntax of include/teraio/tier_args.h: one parser for every command and for
// teraio.parse_tiers, so a spec means the same thing wherever it is written.
#include "teraio/tier_args.h"

#include <fmt/format.h>

#include "teraio/error.h"
#include "teraio/units.h"

namespace teraio {
namespace {

constexpr std::string_view kForms =
    "host:CAPACITY[:READ_GBPS:WRITE_GBPS[:BOTH_GBPS]], file:DIR[,DIR...]:CAPACITY[:READ_GBPS:WRITE_GBPS[:BOTH_GBPS]] or "
    "NAME:CAPACITY:READ_GBPS:WRITE_GBPS, e.g. host:64GiB or file:/mnt/nvme0:500GiB";
constexpr std::string_view kHostForm =
    "[NAME=]host:CAPACITY[:READ_GBPS:WRITE_GBPS[:BOTH_GBPS]], e.g. host:64GiB";
constexpr std::string_view kFileForm =
    "[NAME=]file:DIR[,DIR...]:CAPACITY[:READ_GBPS:WRITE_GBPS[:BOTH_GBPS]], e.g. file:/mnt/nvme0:500GiB";

// The first field of a spec: "host" or "file" after an optional NAME= (then *name is NAME and
// *has_name is set), or the whole field (a NAME of the old form, or a mistake).
std::string_view kind_word(std::string_view head, std::string_view* name, bool* has_name) {
  const size_t eq = head.find('=');
  if (eq != std::string_view::npos) {
    const std::string_view word = head.substr(eq + 1);
    if (word == "host" || word == "file") {
      *name = head.substr(0, eq);
      *has_name = true;
      return word;
    }
  }
  *name = {};
  *has_name = false;
  return head;
}

bool is_size(std::string_view text) {
  try {
    parse_size(text);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// A file spec whose directory list has not ended yet ("file:/a" of "file:/a,/b:1TiB"): the comma
// that follows belongs to the directory list, not to the list of specs.
bool open_file_spec(std::string_view text) {
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos) return false;
  std::string_view name;
  bool has_name = false;
  return kind_word(text.substr(0, colon), &name, &has_name) == "file" &&
         text.find(':', colon + 1) == std::string_view::npos;
}

}  // namespace

TierArg parse_tier_arg(std::string_view text, std::string_view what) {
  TERAIO_CHECK(!text.empty(), "{}: an empty tier spec; expected {}", what, kForms);
  const std::vector<std::string_view> f = split_fields(text, ':');
  TierArg t;
  t.text = std::string(text);
  std::string_view name;
  bool has_name = false;
  const std::string_view word = kind_word(f[0], &name, &has_name);
  const size_t rest = f.size() - 1;  // fields after the first
  size_t cap = 0;                    // index of the capacity field
  if (word == "host" && (rest == 1 || rest == 3 || rest == 4)) {
    t.kind = TierArg::Kind::kHost;
    cap = 1;
  } else if (word == "file" && (rest == 2 || rest == 4 || rest == 5)) {
    t.kind = TierArg::Kind::kFile;
    cap = 2;
    for (std::string_view dir : split_fields(f[1], ',')) {
      TERAIO_CHECK(!dir.empty(), "{} \"{}\": an empty directory in the list \"{}\"", what, text,
                   f[1]);
      t.paths.emplace_back(dir);
    }
  } else if (!has_name && (rest == 3 || rest == 4) && !(word == "file" && !is_size(f[1]))) {
    // NAME:CAPACITY:READ_GBPS:WRITE_GBPS[:BOTH_GBPS] ("file:1TiB:6:6" too: a tier named file).
    TERAIO_CHECK(!word.empty(), "{} \"{}\": the tier name is empty; expected {}", what, text,
                 kForms);
    t.kind = TierArg::Kind::kNamed;
    cap = 1;
  } else if (word == "host") {
    throw Error(fmt::format("{} \"{}\": a host tier is {}", what, text, kHostForm));
  } else if (word == "file") {
    throw Error(fmt::format("{} \"{}\": a file tier is {}", what, text, kFileForm));
  } else {
    throw Error(fmt::format("{} \"{}\": expected {}", what, text, kForms));
  }
  TERAIO_CHECK(!has_name || !name.empty(), "{} \"{}\": the name before '=' is empty", what, text);
  if (has_name || t.kind == TierArg::Kind::kNamed) {
    t.name = std::string(has_name ? name : word);
    t.name_given = true;
  } else {
    t.name = std::string(word);
  }
  t.capacity_bytes = parse_size(f[cap], fmt::format("{} \"{}\" capacity", what, text));
  TERAIO_CHECK(t.capacity_bytes > 0, "{} \"{}\": the capacity must be positive", what, text);
  if (f.size() >= cap + 3) {
    t.read_gbps = parse_positive_double(f[cap + 1], fmt::format("{} \"{}\" read GB/s", what, text));
    t.write_gbps =
        parse_positive_double(f[cap + 2], fmt::format("{} \"{}\" write GB/s", what, text));
  }
  if (f.size() == cap + 4) {
    t.duplex_gbps =
        parse_positive_double(f[cap + 3], fmt::format("{} \"{}\" both-ways GB/s", what, text));
  }
  return t;
}

std::vector<TierArg> parse_tier_arg_list(std::string_view text, std::string_view what) {
  std::vector<TierArg> out;
  size_t start = 0;
  while (true) {
    size_t end = text.find(',', start);
    while (end != std::string_view::npos && open_file_spec(text.substr(start, end - start)))
      end = text.find(',', end + 1);
    out.push_back(parse_tier_arg(
        text.substr(start, end == std::string_view::npos ? end : end - start), what));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
}

void check_session_tier(const TierArg& tier, std::string_view what) {
  TERAIO_CHECK(
      tier.kind != TierArg::Kind::kNamed,
      "{} \"{}\": a Session's tier is host:CAPACITY[:READ_GBPS:WRITE_GBPS[:BOTH_GBPS]] or "
      "file:DIR[,DIR...]:CAPACITY[:READ_GBPS:WRITE_GBPS[:BOTH_GBPS]] (NAME:CAPACITY:READ_GBPS:WRITE_GBPS "
      "is for planning only)",
      what, tier.text);
  const std::string_view kind = tier.kind == TierArg::Kind::kHost ? "host" : "file";
  TERAIO_CHECK(tier.name == kind,
               "{} \"{}\": a Session names its tiers host and file; drop \"{}=\"", what, tier.text,
               tier.name);
}

}  // namespace teraio
