// Python binding of teraio::Session (module teraio._C). Thin: argument conversion only; the
// Python package (python/teraio/__init__.py) holds the user-facing names and validation messages.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/extension.h>

#include "teraio/error.h"
#include "teraio/session.h"
#include "teraio/tier_args.h"
#include "teraio/units.h"
#include "teraio/version.h"

namespace py = pybind11;

namespace {

teraio::SessionTier tier_from_dict(const py::dict& d) {
  teraio::SessionTier t;
  std::string kind = py::cast<std::string>(d["kind"]);
  if (kind == "host") {
    t.kind = teraio::SessionTier::Kind::kHost;
  } else if (kind == "file") {
    t.kind = teraio::SessionTier::Kind::kFile;
    t.paths = py::cast<std::vector<std::string>>(d["paths"]);
  } else {
    throw teraio::Error("unknown tier kind '" + kind + "'");
  }
  t.capacity_bytes = py::cast<uint64_t>(d["capacity_bytes"]);
  if (d.contains("read_gbps")) t.read_gbps = py::cast<double>(d["read_gbps"]);
  if (d.contains("write_gbps")) t.write_gbps = py::cast<double>(d["write_gbps"]);
  return t;
}

py::dict stats_dict(const teraio::SessionStats& s) {
  py::dict d;
  d["mode"] = s.mode;
  d["iteration"] = s.iteration;
  d["budget_bytes"] = s.budget_bytes;
  d["peak_resident_bytes"] = s.peak_resident_bytes;
  d["resident_bytes"] = s.resident_bytes;
  d["pinned_bytes"] = s.pinned_bytes;
  d["step_peak_resident_bytes"] = s.step_peak_resident_bytes;
  d["untracked_bytes"] = s.untracked_bytes;
  d["plan_budget_bytes"] = s.plan_budget_bytes;
  d["plan_variant"] = s.plan_variant;
  d["predicted_iteration_us"] = s.predicted_iteration_us;
  d["kernel_timing"] = s.kernel_timing;
  d["profiled_kernel_us"] = s.profiled_kernel_us;
  d["profiled_event_us"] = s.profiled_event_us;
  d["bytes_offloaded"] = s.bytes_offloaded;
  d["bytes_prefetched"] = s.bytes_prefetched;
  d["stall_us"] = s.stall_us;
  d["plan_moves"] = s.plan_moves;
  d["skipped_moves"] = s.skipped_moves;
  d["aligned_moves"] = s.aligned_moves;
  d["stream_ordered_offloads"] = s.stream_ordered_offloads;
  d["drift_events"] = s.drift_events;
  d["urgent_fetches"] = s.urgent_fetches;
  d["evictions"] = s.evictions;
  d["operators"] = s.operators;
  d["tracked_tensors"] = s.tracked_tensors;
  d["plans_cached"] = s.plans_cached;
  d["budget_violations"] = s.budget_violations;
  d["failed_transfers"] = s.failed_transfers;
  d["retried_reads"] = s.retried_reads;
  d["lost_tensors"] = s.lost_tensors;
  d["last_error"] = s.last_error;
  py::list tiers;
  for (const teraio::SessionTierStats& t : s.tiers) {
    py::dict e;
    e["name"] = t.name;
    e["engine"] = t.engine;
    e["read_gbps"] = t.read_gbps;
    e["write_gbps"] = t.write_gbps;
    e["read_source"] = t.read_source;
    e["write_source"] = t.write_source;
    e["read_gbps_min"] = t.read_gbps_min;
    e["read_gbps_max"] = t.read_gbps_max;
    e["write_gbps_min"] = t.write_gbps_min;
    e["write_gbps_max"] = t.write_gbps_max;
    e["probe_s"] = t.probe_s;
    e["probe_memory"] = t.probe_memory;
    e["notes"] = t.notes;
    tiers.append(std::move(e));
  }
  d["tiers"] = std::move(tiers);
  return d;
}

// Trains a small MLP with libtorch's C++ AdamW (no Python in the step) for `steps` steps, inside a
// C++ teraio::Session (FileTier at `dir`) when budget_bytes > 0. Returns the losses followed by the
// final parameters, for the bitwise test of the C++ path.
std::vector<at::Tensor> cpp_adamw_train(int steps, uint64_t budget_bytes, const std::string& dir) {
  std::unique_ptr<teraio::Session> session;
  if (budget_bytes > 0) {
    teraio::SessionOptions o;
    o.budget_bytes = budget_bytes;
    teraio::SessionTier t;
    t.kind = teraio::SessionTier::Kind::kFile;
    t.paths = {dir};
    t.capacity_bytes = 64ull << 20;
    o.tiers = {t};
    o.min_tensor_bytes = 1024;
    session = std::make_unique<teraio::Session>(std::move(o));
  }
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(64, 128), torch::nn::ReLU(),
                              torch::nn::Linear(128, 128), torch::nn::ReLU(),
                              torch::nn::Linear(128, 10));
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  std::vector<at::Tensor> out;
  for (int i = 0; i < steps; ++i) {
    at::Tensor x = at::randn({32, 64}, gen);
    at::Tensor y = at::randint(0, 10, {32}, gen);
    auto step = [&] {
      opt.zero_grad();
      at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      loss.backward();
      opt.step();
      return loss.detach().clone();
    };
    if (session) {
      auto guard = session->step();
      out.push_back(step());
    } else {
      out.push_back(step());
    }
  }
  if (session) session->fetch_all();
  for (const at::Tensor& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "teraio native extension (use the teraio package)";
  m.attr("__version__") = teraio::version();
  static py::exception<teraio::Error> error(m, "Error", PyExc_ValueError);
  static py::exception<teraio::IoError> io_error(m, "IoError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const teraio::IoError& e) {
      PyErr_SetString(io_error.ptr(), e.what());
    } catch (const teraio::Error& e) {
      PyErr_SetString(error.ptr(), e.what());
    }
  });
  m.def("_cpp_adamw_train", &cpp_adamw_train, py::call_guard<py::gil_scoped_release>());
  m.def("parse_size", [](const std::string& text, const std::string& what) {
    return teraio::parse_size(text, what);
  });
  // The C++ tier spec parser (teraio/tier_args.h), for teraio.parse_tiers: one dict per tier of
  // the list, each a tier a Session can open.
  m.def("parse_tier_list", [](const std::string& text, const std::string& what) {
    py::list out;
    for (const teraio::TierArg& a : teraio::parse_tier_arg_list(text, what)) {
      teraio::check_session_tier(a, what);
      py::dict d;
      d["kind"] = a.kind == teraio::TierArg::Kind::kHost ? "host" : "file";
      d["paths"] = a.paths;
      d["capacity_bytes"] = a.capacity_bytes;
      d["read_gbps"] = a.read_gbps;
      d["write_gbps"] = a.write_gbps;
      out.append(std::move(d));
    }
    return out;
  });
  py::class_<teraio::Session>(m, "Session")
      .def(py::init([](uint64_t budget_bytes, const py::list& tiers, int profiling_iterations,
                       uint64_t min_tensor_bytes, bool planning, std::string trace_path,
                       std::string plan_path, bool plan_search, bool stream_ordered_offloads,
                       bool verify, bool fault_injection) {
             teraio::SessionOptions o;
             o.budget_bytes = budget_bytes;
             for (const auto& t : tiers) o.tiers.push_back(tier_from_dict(py::cast<py::dict>(t)));
             o.profiling_iterations = profiling_iterations;
             o.min_tensor_bytes = min_tensor_bytes;
             o.planning = planning;
             o.trace_path = std::move(trace_path);
             o.plan_path = std::move(plan_path);
             o.plan_search = plan_search;
             o.stream_ordered_offloads = stream_ordered_offloads;
             o.verify = verify;
             o.fault_injection = fault_injection;
             return std::make_unique<teraio::Session>(std::move(o));
           }),
           py::arg("budget_bytes"), py::arg("tiers"), py::arg("profiling_iterations") = 2,
           py::arg("min_tensor_bytes") = 4096, py::arg("planning") = true,
           py::arg("trace_path") = "", py::arg("plan_path") = "", py::arg("plan_search") = true,
           py::arg("stream_ordered_offloads") = true, py::arg("verify") = true,
           py::arg("fault_injection") = false)
      .def("begin_step", &teraio::Session::begin_step, py::call_guard<py::gil_scoped_release>())
      .def("end_step", &teraio::Session::end_step, py::call_guard<py::gil_scoped_release>())
      .def("fetch_all", &teraio::Session::fetch_all, py::call_guard<py::gil_scoped_release>())
      .def("close", &teraio::Session::close, py::call_guard<py::gil_scoped_release>())
      .def(
          "inject_fault",
          [](teraio::Session& s, size_t tier, const std::string& kind, const std::string& direction,
             uint64_t nth, uint64_t count, int error_code) {
            namespace st = teraio::storage;
            st::FaultRule r;
            if (kind == "error") {
              r.kind = st::FaultKind::kError;
            } else if (kind == "short") {
              r.kind = direction == "write" ? st::FaultKind::kShortWrite : st::FaultKind::kShortRead;
            } else {
              throw teraio::Error("inject_fault: kind must be 'error' or 'short', got '" + kind + "'");
            }
            if (direction == "read") {
              r.direction = st::Direction::kRead;
            } else if (direction == "write") {
              r.direction = st::Direction::kWrite;
            } else if (direction != "any") {
              throw teraio::Error("inject_fault: direction must be 'read', 'write' or 'any', got '" +
                                  direction + "'");
            }
            r.nth_request = nth;
            r.count = count;
            r.error_code = error_code;
            s.inject_fault(tier, r);
          },
          py::arg("tier"), py::arg("kind"), py::arg("direction"), py::arg("nth"), py::arg("count"),
          py::arg("error_code"))
      .def("clear_faults", &teraio::Session::clear_faults)
      .def("name_tensor", &teraio::Session::name_tensor)
      .def("stats", [](const teraio::Session& s) { return stats_dict(s.stats()); });
}
