// `teraio iobench`: bandwidth of the storage tiers (docs/storage.md, "iobench") per direction over
// request size, queue depth and number of paths, with host or device buffers, next to the raw
// hardware measured in the same run (O_DIRECT pread/pwrite of the same files; pinned cudaMemcpy).
// Reports median, min and max over repeats; --probe says which I/O path a directory gets and why.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "command.h"
#include "option_checks.h"
#include "teraio/json_text.h"
#include "teraio/error.h"
#include "teraio/storage.h"
#include "teraio/units.h"

namespace teraio::cli {
namespace {

using namespace teraio::storage;

struct IobenchArgs {
  std::string tier = "file";
  std::vector<std::string> paths;
  std::string size = "1GiB";
  std::vector<std::string> requests = {"4MiB"};
  std::vector<int> queue_depths = {8};
  int repeat = 5;
  std::string device = "cpu";
  std::string direction = "both";
  std::string engine = "auto";
  std::string gds = "off";
  std::string stripe = "1MiB";
  bool all_path_counts = false;
  bool no_direct = false;
  bool checksums = false;
  bool verify = false;
  bool probe = false;
  bool quick = false;
  bool json = false;
};

// At least 1 ns, so a bandwidth computed from it is always finite.
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::max(1e-9, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

struct Row {
  std::string tier, engine, direction, buffer;
  int paths = 1;
  uint64_t request_bytes = 0;
  int queue_depth = 0;
  Spread gbps;
  Spread raw_gbps;  // 0 when not measured
  std::string raw_what;
  bool verified = false;
};

// Fills `n` bytes with a pattern that depends on the tier offset, so reads can be checked.
void fill(unsigned char* p, uint64_t n, uint64_t tier_offset) {
  for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>((tier_offset + i) * 2654435761u >> 13);
}
bool check(const unsigned char* p, uint64_t n, uint64_t tier_offset) {
  for (uint64_t i = 0; i < n; ++i) {
    if (p[i] != static_cast<unsigned char>((tier_offset + i) * 2654435761u >> 13)) return false;
  }
  return true;
}

// One pass over `total` bytes in `request`-sized requests with `window` requests in flight
// (run_pass, shared with the Session's probe). Returns GB/s. With verify, writes carry the
// pattern and reads are checked inside the timing: do not compare verified and unverified numbers.
double iobench_pass(Tier& tier, Direction dir, uint64_t total, uint64_t request, int window,
                    Buffer& buf, std::vector<unsigned char>& host_stage, bool verify) {
  PassOptions o;
  o.size_bytes = total;
  o.request_bytes = request;
  o.window = window;
  if (verify) {
    o.before_write = [&](BufferView v, uint64_t off) {
      if (v.is_device()) {
        fill(host_stage.data(), v.size_bytes(), off);
        copy_buffer(v, BufferView::host(host_stage.data(), v.size_bytes()));
      } else {
        fill(static_cast<unsigned char*>(v.data()), v.size_bytes(), off);
      }
    };
    o.after_read = [&](BufferView v, uint64_t off) {
      const unsigned char* p = static_cast<const unsigned char*>(v.data());
      if (v.is_device()) {
        copy_buffer(BufferView::host(host_stage.data(), v.size_bytes()), v);
        p = host_stage.data();
      }
      TERAIO_CHECK(check(p, v.size_bytes(), off),
                   "iobench --verify: data read back at tier offset {} differs", off);
    };
  }
  const PassResult r = run_pass(tier, dir, buf.view(), o);
  return static_cast<double>(total) / r.seconds / 1e9;
}

// The raw disk: O_DIRECT sequential pread/pwrite of the tier's own files, one thread per file.
double raw_disk_pass(const std::vector<std::string>& files, Direction dir, uint64_t total, uint64_t request) {
  uint64_t per_file = total / files.size() / 4096 * 4096;
  uint64_t req = std::max<uint64_t>(request / 4096 * 4096, 4096);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(files.size());
  auto t0 = std::chrono::steady_clock::now();
  for (size_t f = 0; f < files.size(); ++f) {
    threads.emplace_back([&, f] {
      int fd = ::open(files[f].c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
      bool direct = fd >= 0;
      if (!direct) fd = ::open(files[f].c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) {
        errors[f] = fmt::format("{}: {}", files[f], std::strerror(errno));
        return;
      }
      void* p = nullptr;
      if (posix_memalign(&p, 4096, req) != 0) {
        errors[f] = "out of memory";
        ::close(fd);
        return;
      }
      std::memset(p, 0x5A, req);
      for (uint64_t off = 0; off < per_file && errors[f].empty(); off += req) {
        uint64_t len = std::min(req, per_file - off);
        ssize_t r = dir == Direction::kWrite ? ::pwrite(fd, p, len, static_cast<off_t>(off))
                                             : ::pread(fd, p, len, static_cast<off_t>(off));
        if (r != static_cast<ssize_t>(len)) {
          errors[f] = fmt::format("{} at {}: {}", files[f], off, r < 0 ? std::strerror(errno) : "short transfer");
        }
      }
      if (dir == Direction::kWrite && !direct) ::fdatasync(fd);
      std::free(p);
      ::close(fd);
    });
  }
  for (auto& t : threads) t.join();
  double sec = seconds_since(t0);
  for (auto& e : errors) TERAIO_CHECK(e.empty(), "iobench raw disk pass failed: {}", e);
  return static_cast<double>(per_file * files.size()) / sec / 1e9;
}

double host_link_pass(Direction dir, uint64_t bytes, Buffer& pinned, Buffer& dev) {
  auto t0 = std::chrono::steady_clock::now();
  if (dir == Direction::kWrite) {
    copy_buffer(pinned.view().subview(0, bytes), dev.view().subview(0, bytes));  // device -> host (offload)
  } else {
    copy_buffer(dev.view().subview(0, bytes), pinned.view().subview(0, bytes));  // host -> device (prefetch)
  }
  return static_cast<double>(bytes) / seconds_since(t0) / 1e9;
}

std::vector<Direction> directions(const std::string& d) {
  if (d == "read") return {Direction::kRead};
  if (d == "write") return {Direction::kWrite};
  TERAIO_CHECK(d == "both", "--direction: '{}' is not read, write or both", d);
  return {Direction::kWrite, Direction::kRead};
}


int run_probe(const IobenchArgs& a) {
  TERAIO_CHECK(!a.paths.empty(), "iobench --probe: give at least one --path DIR");
  GdsMode mode = a.gds == "off" ? GdsMode::kAuto : parse_gds_mode(a.gds);  // probing means trying
  auto uring = probe_io_uring();
  std::string out = "[";
  for (size_t i = 0; i < a.paths.size(); ++i) {
    const auto& p = a.paths[i];
    auto dio = probe_direct_io(p);
    auto gds = probe_gds(p);
    std::string use = gds.usable ? "cufile (GPUDirect Storage) for device buffers, " : "";
    use += uring.supported ? "io_uring" : "thread-pool pread/pwrite";
    use += dio.supported ? " with O_DIRECT" : " with buffered I/O";
    if (a.json) {
      out += fmt::format(
          "{}{{\"path\":{},\"will_use\":{},\"o_direct\":{},\"o_direct_reason\":{},\"io_uring\":{},"
          "\"io_uring_reason\":{},\"gds\":{{\"mode\":{},\"library_loaded\":{},\"driver_opened\":{},"
          "\"handle_registered\":{},\"io_ok\":{},\"usable\":{},\"step\":{},\"error_code\":{},\"reason\":{}}},"
          "\"cuda_devices\":{}}}",
          i ? "," : "", json_quote(p), json_quote(use), dio.supported, json_quote(dio.reason), uring.supported,
          json_quote(uring.reason), json_quote(std::string(to_string(mode))), gds.library_loaded, gds.driver_opened,
          gds.handle_registered, gds.io_ok, gds.usable, json_quote(gds.step), gds.error_code, json_quote(gds.reason),
          cuda_device_count());
    } else {
      fmt::print("path {}\n", p);
      fmt::print("  will use      {}\n", use);
      fmt::print("  O_DIRECT      {}{}\n", dio.supported ? "yes" : "no", dio.reason.empty() ? "" : " (" + dio.reason + ")");
      fmt::print("  io_uring      {}{}\n", uring.supported ? "yes" : "no",
                 uring.reason.empty() ? "" : " (" + uring.reason + ")");
      fmt::print("  cuda devices  {}{}\n", cuda_device_count(),
                 cuda_device_count() ? "" : " (" + cuda_unavailable_reason() + ")");
      fmt::print("  GDS (cuFile)  {}: {}\n", gds.usable ? "usable" : "not used", gds.reason);
      if (!gds.usable) {
        fmt::print("                failing step {}, cuFile error {}\n", gds.step.empty() ? "-" : gds.step,
                   gds.error_code);
      }
    }
  }
  if (a.json) fmt::print("{}]\n", out);
  return 0;
}

std::unique_ptr<Tier> make_bench_tier(const IobenchArgs& a, int paths, int qd, uint64_t total,
                                      uint64_t stripe) {
  if (a.tier == "host") {
    HostTierOptions o;
    o.capacity_bytes = total;
    o.worker_threads = std::max(1, std::min(qd, 8));
    o.checksums = a.checksums;
    return make_host_tier(o);
  }
  FileTierOptions o;
  o.paths.assign(a.paths.begin(), a.paths.begin() + paths);
  o.capacity_bytes = total;
  o.stripe_bytes = stripe;
  o.queue_depth = qd;
  o.direct_io = !a.no_direct;
  o.checksums = a.checksums;
  o.gds = parse_gds_mode(a.gds);
  o.engine = a.engine == "io_uring" ? FileEngine::kIoUring
             : a.engine == "threads" ? FileEngine::kThreads
                                     : FileEngine::kAuto;
  o.job_name = "teraio-iobench";
  return a.engine == "sync" ? make_sync_file_tier(o) : make_file_tier(o);
}

// --quick: the probe a Session runs for a tier whose bandwidth was not given (quick_probe_options
// on a tier with the Session's defaults), with what it costs.
int run_quick(const IobenchArgs& a, bool cuda, uint64_t total, uint64_t stripe) {
  const int qd = a.tier == "host" ? HostTierOptions{}.worker_threads : FileTierOptions{}.queue_depth;
  std::unique_ptr<Tier> tier = make_bench_tier(a, static_cast<int>(a.paths.size()), qd, total, stripe);
  const TierInfo info = tier->info();
  Buffer scratch = Buffer::allocate(kQuickProbeScratchBytes, cuda ? MemoryKind::kDevice : MemoryKind::kHostPinned, 0);
  const BandwidthProbe p = probe_bandwidth(*tier, scratch.view(), 0, std::min(kQuickProbeTierBytes, total),
                                           quick_probe_options(info));
  std::vector<std::string> notes = info.notes;
  notes.insert(notes.end(), p.notes.begin(), p.notes.end());
  if (a.json) {
    std::string out = fmt::format(
        "{{\"format\":\"teraio.iobench.quick\",\"version\":1,\"tier\":{},\"engine\":{},\"memory\":{},"
        "\"pass_bytes\":{},\"request_bytes\":{},\"queue_depth\":{},"
        "\"write_gbps\":{{\"median\":{:.3f},\"upper\":{:.3f},\"min\":{:.3f},\"max\":{:.3f}}},\"write_passes\":{},"
        "\"read_gbps\":{{\"median\":{:.3f},\"upper\":{:.3f},\"min\":{:.3f},\"max\":{:.3f}}},\"read_passes\":{},"
        "\"both_gbps\":{{\"median\":{:.3f},\"upper\":{:.3f},\"min\":{:.3f},\"max\":{:.3f}}},\"both_passes\":{},"
        "\"planned_gbps\":{{\"read\":{:.3f},\"write\":{:.3f},\"both\":{:.3f}}},"
        "\"elapsed_s\":{:.4f},\"cut\":{},\"page_cache\":{},\"notes\":[",
        json_quote(p.tier), json_quote(p.engine), json_quote(p.memory), p.pass_bytes, p.request_bytes,
        p.queue_depth, p.write_gbps.median, p.write_gbps.upper, p.write_gbps.min, p.write_gbps.max,
        p.write_passes, p.read_gbps.median, p.read_gbps.upper, p.read_gbps.min, p.read_gbps.max,
        p.read_passes, p.both_gbps.median, p.both_gbps.upper, p.both_gbps.min, p.both_gbps.max,
        p.both_passes, planned_gbps(p.read_gbps, info), planned_gbps(p.write_gbps, info),
        planned_gbps(p.both_gbps, info), p.elapsed_s, p.cut, p.page_cache);
    for (size_t i = 0; i < notes.size(); ++i) out += (i ? "," : "") + json_quote(notes[i]);
    fmt::print("{}]}}\n", out);
    return 0;
  }
  fmt::print("iobench --quick: {} tier ({}), {} of the tier per pass, {} requests x {} in flight, {} scratch\n",
             p.tier, p.engine, format_bytes(static_cast<double>(p.pass_bytes)),
             format_bytes(static_cast<double>(p.request_bytes)), p.queue_depth, p.memory);
  fmt::print("write {:.2f} GB/s [{:.2f}, {:.2f}] ({} passes), read {:.2f} GB/s [{:.2f}, {:.2f}] ({} passes), "
             "both ways {:.2f} GB/s per direction [{:.2f}, {:.2f}] ({} passes), probe took {:.3f} s\n",
             p.write_gbps.median, p.write_gbps.min, p.write_gbps.max, p.write_passes, p.read_gbps.median,
             p.read_gbps.min, p.read_gbps.max, p.read_passes, p.both_gbps.median, p.both_gbps.min,
             p.both_gbps.max, p.both_passes, p.elapsed_s);
  fmt::print("a Session plans with: read {:.2f}, write {:.2f}, both ways {:.2f} GB/s (the {} of the passes)\n",
             planned_gbps(p.read_gbps, info), planned_gbps(p.write_gbps, info),
             planned_gbps(p.both_gbps, info), planned_statistic(info));
  for (auto& n : notes) fmt::print("note: {}\n", n);
  return 0;
}

int run_iobench(const IobenchArgs& a) {
  if (a.probe) return run_probe(a);
  TERAIO_CHECK(a.tier == "file" || a.tier == "host", "--tier: '{}' is not host or file", a.tier);
  TERAIO_CHECK(a.tier == "host" || !a.paths.empty(), "iobench --tier file: give at least one --path DIR");
  TERAIO_CHECK(a.device == "cpu" || a.device == "cuda", "--device: '{}' is not cpu or cuda", a.device);
  TERAIO_CHECK(a.repeat >= 1, "--repeat must be >= 1, got {}", a.repeat);
  TERAIO_CHECK(a.engine == "auto" || a.engine == "io_uring" || a.engine == "threads" || a.engine == "sync",
               "--engine: '{}' is not auto, io_uring, threads or sync", a.engine);
  bool cuda = a.device == "cuda";
  if (cuda) TERAIO_CHECK(cuda_device_count() > 0, "--device cuda: {}", cuda_unavailable_reason());
  uint64_t total = parse_size(a.size, "--size");
  TERAIO_CHECK(total > 0, "--size must be > 0");
  uint64_t stripe = parse_size(a.stripe, "--stripe");
  std::vector<uint64_t> requests;
  for (const auto& r : a.requests) {
    requests.push_back(parse_size(r, "--request"));
    TERAIO_CHECK(requests.back() > 0, "--request must be > 0");
  }
  for (int q : a.queue_depths) TERAIO_CHECK(q >= 1, "--queue-depth must be >= 1, got {}", q);
  if (a.quick) return run_quick(a, cuda, total, stripe);
  auto dirs = directions(a.direction);

  std::vector<int> path_counts;
  if (a.tier == "file") {
    if (a.all_path_counts) {
      for (size_t k = 1; k <= a.paths.size(); ++k) path_counts.push_back(static_cast<int>(k));
    } else {
      path_counts.push_back(static_cast<int>(a.paths.size()));
    }
  } else {
    path_counts.push_back(0);
  }

  std::vector<Row> rows;
  std::vector<std::string> notes;
  Spread link_h2d, link_d2h;
  bool have_link = cuda_device_count() > 0;
  uint64_t max_request = *std::max_element(requests.begin(), requests.end());
  std::vector<unsigned char> host_stage(a.verify ? max_request : 0);

  if (have_link) {
    uint64_t link_bytes = std::min<uint64_t>(total, 1ull << 30);
    Buffer pinned = Buffer::allocate(link_bytes, MemoryKind::kHostPinned, 0);
    Buffer dev = Buffer::allocate(link_bytes, MemoryKind::kDevice, 0);
    std::vector<double> h2d, d2h;
    host_link_pass(Direction::kRead, link_bytes, pinned, dev);  // warm-up
    for (int r = 0; r < a.repeat; ++r) {
      h2d.push_back(host_link_pass(Direction::kRead, link_bytes, pinned, dev));
      d2h.push_back(host_link_pass(Direction::kWrite, link_bytes, pinned, dev));
    }
    link_h2d = spread(h2d);
    link_d2h = spread(d2h);
  }

  for (int np : path_counts) {
    for (int qd : a.queue_depths) {
      std::unique_ptr<Tier> tier = make_bench_tier(a, np, qd, total, stripe);
      TierInfo info = tier->info();
      for (auto& n : info.notes) {
        if (std::find(notes.begin(), notes.end(), n) == notes.end()) notes.push_back(n);
      }
      for (uint64_t request : requests) {
        int window = std::max(1, qd * std::max(1, np));
        uint64_t buf_bytes = std::min<uint64_t>(total, request * static_cast<uint64_t>(window));
        window = static_cast<int>(std::max<uint64_t>(1, (buf_bytes + request - 1) / request));
        Buffer buf = Buffer::allocate(request * static_cast<uint64_t>(window),
                                      cuda ? MemoryKind::kDevice : MemoryKind::kHostPinned, 0);
        for (Direction dir : dirs) {
          if (dir == Direction::kRead) {
            // Data to read (the raw write pass overwrote the tier's files with its own bytes).
            iobench_pass(*tier, Direction::kWrite, total, request, window, buf, host_stage, a.verify);
          }
          std::vector<double> v, raw;
          for (int r = 0; r < a.repeat; ++r) {
            v.push_back(iobench_pass(*tier, dir, total, request, window, buf, host_stage, a.verify));
            if (a.tier == "file") raw.push_back(raw_disk_pass(info.files, dir, total, request));
          }
          Row row;
          row.tier = a.tier;
          row.engine = info.engine;
          row.direction = std::string(to_string(dir));
          row.buffer = cuda ? "device" : (buf.pinned() ? "pinned" : "host");
          row.paths = np;
          row.request_bytes = request;
          row.queue_depth = qd;
          row.gbps = spread(v);
          row.verified = a.verify;
          if (a.tier == "file") {
            row.raw_gbps = spread(raw);
            row.raw_what = "O_DIRECT pread/pwrite, 1 thread per file";
          } else if (have_link) {
            row.raw_gbps = dir == Direction::kWrite ? link_d2h : link_h2d;
            row.raw_what = "pinned cudaMemcpy";
          }
          rows.push_back(row);
        }
      }
    }
  }

  if (a.json) {
    std::string out = fmt::format(
        "{{\"format\":\"teraio.iobench\",\"version\":1,\"config\":{{\"tier\":{},\"paths\":[", json_quote(a.tier));
    for (size_t i = 0; i < a.paths.size(); ++i) out += (i ? "," : "") + json_quote(a.paths[i]);
    out += fmt::format("],\"size_bytes\":{},\"repeat\":{},\"device\":{},\"engine\":{},\"gds\":{},\"stripe_bytes\":{},"
                       "\"direct_io\":{},\"checksums\":{},\"verify\":{}}},\"cuda_devices\":{},",
                       total, a.repeat, json_quote(a.device), json_quote(a.engine), json_quote(a.gds), stripe, !a.no_direct,
                       a.checksums, a.verify, cuda_device_count());
    if (have_link) {
      out += fmt::format("\"host_link\":{{\"h2d_gbps\":{{\"median\":{:.3f},\"min\":{:.3f},\"max\":{:.3f}}},"
                         "\"d2h_gbps\":{{\"median\":{:.3f},\"min\":{:.3f},\"max\":{:.3f}}}}},",
                         link_h2d.median, link_h2d.min, link_h2d.max, link_d2h.median, link_d2h.min, link_d2h.max);
    }
    out += "\"notes\":[";
    for (size_t i = 0; i < notes.size(); ++i) out += (i ? "," : "") + json_quote(notes[i]);
    out += "],\"results\":[";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      out += fmt::format(
          "{}{{\"tier\":{},\"engine\":{},\"direction\":{},\"buffer\":{},\"paths\":{},\"request_bytes\":{},"
          "\"queue_depth\":{},\"gbps\":{{\"median\":{:.3f},\"min\":{:.3f},\"max\":{:.3f}}},"
          "\"raw_gbps\":{{\"median\":{:.3f},\"min\":{:.3f},\"max\":{:.3f}}},\"raw\":{},\"verified\":{}}}",
          i ? "," : "", json_quote(r.tier), json_quote(r.engine), json_quote(r.direction), json_quote(r.buffer), r.paths,
          r.request_bytes, r.queue_depth, r.gbps.median, r.gbps.min, r.gbps.max, r.raw_gbps.median, r.raw_gbps.min,
          r.raw_gbps.max, json_quote(r.raw_what), r.verified);
    }
    fmt::print("{}]}}\n", out);
    return 0;
  }
  fmt::print("iobench: tier {}, {} per pass, {} repeats, buffers on {}{}\n", a.tier, format_bytes(static_cast<double>(total)),
             a.repeat, a.device, a.verify ? ", verified" : "");
  if (have_link) {
    fmt::print("host link (pinned cudaMemcpy): h2d {:.2f} GB/s [{:.2f}, {:.2f}], d2h {:.2f} GB/s [{:.2f}, {:.2f}]\n",
               link_h2d.median, link_h2d.min, link_h2d.max, link_d2h.median, link_d2h.min, link_d2h.max);
  }
  for (auto& n : notes) fmt::print("note: {}\n", n);
  fmt::print("{:<6} {:<14} {:>5} {:<6} {:>10} {:>4} {:<7} {:>24} {:>24}\n", "tier", "engine", "paths", "dir",
             "request", "qd", "buffer", "GB/s median [min, max]", "raw GB/s median [min,max]");
  for (const Row& r : rows) {
    std::string raw = r.raw_what.empty() ? "-"
                                         : fmt::format("{:.2f} [{:.2f}, {:.2f}]", r.raw_gbps.median, r.raw_gbps.min,
                                                       r.raw_gbps.max);
    fmt::print("{:<6} {:<14} {:>5} {:<6} {:>10} {:>4} {:<7} {:>24} {:>24}\n", r.tier, r.engine, r.paths, r.direction,
               format_bytes(static_cast<double>(r.request_bytes)), r.queue_depth, r.buffer,
               fmt::format("{:.2f} [{:.2f}, {:.2f}]", r.gbps.median, r.gbps.min, r.gbps.max), raw);
  }
  return 0;
}

const Registration kIobench{{
    "iobench",
    "Measure storage-tier bandwidth next to the raw disk and host link; probe GDS/O_DIRECT/io_uring",
    60,
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<IobenchArgs>();
      sub.add_option("--tier", a->tier, "tier to measure: host or file")->capture_default_str();
      sub.add_option("--path", a->paths, "directory for the file tier, one per SSD (repeat for several)");
      sub.add_option("--size", a->size, "bytes moved per pass (and tier capacity)")->capture_default_str();
      sub.add_option("--request", a->requests, "request size; several values sweep (e.g. --request 1MiB 16MiB)")
          ->capture_default_str();
      sub.add_option("--queue-depth", a->queue_depths, "in-flight chunks per path; several values sweep")
          ->capture_default_str()
          ->check(in_range(1, 1024));
      sub.add_option("--repeat", a->repeat, "passes per configuration (median, min and max are reported)")
          ->capture_default_str()
          ->check(in_range(1, 10000));
      sub.add_option("--device", a->device, "buffer memory: cpu (pinned host) or cuda (device 0)")->capture_default_str();
      sub.add_option("--direction", a->direction, "read, write or both")->capture_default_str();
      sub.add_option("--engine", a->engine, "file engine: auto, io_uring, threads or sync")->capture_default_str();
      sub.add_option("--gds", a->gds, "GPUDirect Storage for device buffers: on, off or auto")->capture_default_str();
      sub.add_option("--stripe", a->stripe, "striping unit and bounce-buffer size")->capture_default_str();
      sub.add_flag("--sweep-paths", a->all_path_counts, "also measure with the first 1, 2, ... of the given paths");
      sub.add_flag("--no-direct", a->no_direct, "do not use O_DIRECT");
      sub.add_flag("--checksums", a->checksums, "enable the tier's checksums (XXH3 per piece, verified on read)");
      sub.add_flag("--verify", a->verify, "write a pattern and check every byte read back");
      sub.add_flag("--probe", a->probe, "print, for each --path, which I/O path it gets and why (GDS, O_DIRECT, io_uring)");
      sub.add_flag("--quick", a->quick,
                   "the short probe a Session runs for a tier without a given bandwidth (see docs)");
      sub.add_flag("--json", a->json, "print one JSON object (teraio.iobench v1) instead of the table");
      return [a] { return run_iobench(*a); };
    },
}};

}  // namespace
}  // namespace teraio::cli
