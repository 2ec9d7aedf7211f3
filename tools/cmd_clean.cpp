// `teraio clean DIR...` (docs/clean.md): removes the file-tier directories that killed jobs left in
// DIR (teraio::storage::clean_tier_dirs: only those whose lock is free, only teraio's own files),
// prints each one and the bytes freed. Every DIR is checked before anything is removed.
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "command.h"
#include "teraio/error.h"
#include "teraio/storage.h"
#include "teraio/units.h"

namespace teraio::cli {
namespace {

using storage::TierDirState;

struct CleanArgs {
  std::vector<std::string> dirs;
  std::string job;
  bool dry_run = false;
};

int run_clean(const CleanArgs& args) {
  for (const std::string& d : args.dirs) {
    struct stat st;
    TERAIO_CHECK(::stat(d.c_str(), &st) == 0, "clean: {}: {}", d, std::strerror(errno));
    TERAIO_CHECK(S_ISDIR(st.st_mode), "clean: {}: not a directory", d);
  }
  uint64_t freed_bytes = 0;
  size_t removed = 0, in_use = 0, kept = 0;
  for (const std::string& d : args.dirs) {
    const auto reports = storage::clean_tier_dirs(d, {args.job, args.dry_run});
    for (const storage::TierDirReport& r : reports) {
      const std::string size = format_bytes(static_cast<double>(r.bytes));
      switch (r.state) {
        case TierDirState::kRemoved:
        case TierDirState::kStale:
          fmt::print("{:<14} {}  {}\n", args.dry_run ? "would remove" : "removed", r.path, size);
          freed_bytes += r.bytes;
          ++removed;
          break;
        case TierDirState::kInUse:
          fmt::print("{:<14} {}  ({})\n", "in use", r.path, r.reason);
          ++in_use;
          break;
        case TierDirState::kKept:
          fmt::print("{:<14} {}  {} ({})\n", "kept", r.path, size, r.reason);
          ++kept;
          break;
      }
    }
  }
  fmt::print("{} {} ({} bytes) in {} director{}; {} in use, {} kept\n",
             args.dry_run ? "would free" : "freed", format_bytes(static_cast<double>(freed_bytes)),
             freed_bytes, removed, removed == 1 ? "y" : "ies", in_use, kept);
  return 0;
}

const Registration kClean{{
    "clean",
    "Remove the file-tier directories that killed jobs left behind, and say what that freed",
    80,
    [](CLI::App& sub) -> std::function<int()> {
      auto args = std::make_shared<CleanArgs>();
      sub.add_option("dir", args->dirs,
                     "directories given to file tiers (--tier file:DIR, --path DIR)")
          ->required();
      sub.add_option("--job", args->job,
                     "only directories of this job name (the tier's job_name, e.g. teraio); "
                     "default: every job");
      sub.add_flag("--dry-run", args->dry_run, "only say what would be removed");
      return [args] { return run_clean(*args); };
    },
}};

}  // namespace
}  // namespace teraio::cli
