// Python binding of teraio::Session (module teraio._C). Thin: argument conversion only; the
// Python package (python/teraio/__init__.py) holds the user-facing names and validation messages.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/extension.h>

#include <type_traits>

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
  if (d.contains("duplex_gbps")) t.duplex_gbps = py::cast<double>(d["duplex_gbps"]);
  return t;
}

// Note [Options and stats fields]: every field through the lists of include/teraio/session.h.
py::dict tier_stats_dict(const teraio::SessionTierStats& t) {
  py::dict e;
  teraio::for_each_tier_stats_field([&](const char* name, auto member) { e[name] = t.*member; });
  return e;
}

py::dict stats_dict(const teraio::SessionStats& s) {
  py::dict d;
  teraio::for_each_stats_field([&](const char* name, auto member, teraio::StatKind) {
    using T = std::decay_t<decltype(s.*member)>;
    if constexpr (std::is_same_v<T, std::vector<teraio::SessionTierStats>>) {
      py::list tiers;
      for (const teraio::SessionTierStats& t : s.*member) tiers.append(tier_stats_dict(t));
      d[name] = std::move(tiers);
    } else {
      d[name] = s.*member;
    }
  });
  return d;
}

// SessionOptions from arguments named as its fields (keywords; positional ones in the fields'
// order). Unknown names, too many arguments and one given twice are errors.
teraio::SessionOptions options_from_args(const py::args& args, const py::kwargs& kw) {
  teraio::SessionOptions o;
  size_t index = 0, known = 0;
  teraio::for_each_option_field([&](const char* name, auto member) {
    const size_t i = index++;
    py::object value;
    if (i < args.size()) {
      if (kw.contains(name))
        throw teraio::Error(std::string("Session: option '") + name + "' given twice");
      value = args[i];
    } else if (kw.contains(name)) {
      known++;
      value = kw[name];
    } else {
      return;
    }
    using T = std::decay_t<decltype(o.*member)>;
    if constexpr (std::is_same_v<T, std::vector<teraio::SessionTier>>) {
      for (const auto& t : py::cast<py::list>(value))
        (o.*member).push_back(tier_from_dict(py::cast<py::dict>(t)));
    } else {
      o.*member = py::cast<T>(value);
    }
  });
  if (args.size() > index)
    throw teraio::Error("Session: " + std::to_string(args.size()) + " arguments given, at most " +
                        std::to_string(index) + " exist");
  if (known != kw.size()) {
    for (const auto& [key, value] : kw) {
      const std::string k = py::cast<std::string>(key);
      bool found = false;
      teraio::for_each_option_field([&](const char* name, auto) { found = found || k == name; });
      if (!found) throw teraio::Error("Session: unknown option '" + k + "'");
    }
  }
  return o;
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
  // The field lists (Note [Options and stats fields]), for the package and the bench scripts.
  py::list option_names, stats_names, counter_names, tier_names;
  py::dict option_defaults;
  const teraio::SessionOptions defaults;
  teraio::for_each_option_field([&](const char* name, auto member) {
    option_names.append(name);
    using T = std::decay_t<decltype(defaults.*member)>;
    if constexpr (!std::is_same_v<T, std::vector<teraio::SessionTier>>)
      option_defaults[name] = defaults.*member;
  });
  teraio::for_each_stats_field([&](const char* name, auto, teraio::StatKind kind) {
    stats_names.append(name);
    if (kind == teraio::StatKind::kCounter) counter_names.append(name);
  });
  teraio::for_each_tier_stats_field([&](const char* name, auto) { tier_names.append(name); });
  m.attr("SESSION_OPTIONS") = option_names;
  m.attr("SESSION_OPTION_DEFAULTS") = option_defaults;
  m.attr("STATS_FIELDS") = stats_names;
  m.attr("STATS_COUNTERS") = counter_names;
  m.attr("TIER_STATS_FIELDS") = tier_names;
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
      d["duplex_gbps"] = a.duplex_gbps;
      out.append(std::move(d));
    }
    return out;
  });
  py::class_<teraio::Session>(m, "Session")
      // Arguments named as SessionOptions' fields (tiers: a list of dicts).
      .def(py::init([](const py::args& args, const py::kwargs& kw) {
        return std::make_unique<teraio::Session>(options_from_args(args, kw));
      }))
      .def("begin_step", &teraio::Session::begin_step, py::call_guard<py::gil_scoped_release>())
      .def("end_step", &teraio::Session::end_step, py::call_guard<py::gil_scoped_release>())
      .def("fetch_all", &teraio::Session::fetch_all, py::call_guard<py::gil_scoped_release>())
      .def("close", &teraio::Session::close, py::call_guard<py::gil_scoped_release>())
      .def(
          "inject_fault",
          [](teraio::Session& s, size_t tier, const std::string& kind, const std::string& direction,
             uint64_t nth, uint64_t count, int error_code, uint64_t delay_us) {
            namespace st = teraio::storage;
            st::FaultRule r;
            if (kind == "error") {
              r.kind = st::FaultKind::kError;
            } else if (kind == "short") {
              r.kind = direction == "write" ? st::FaultKind::kShortWrite : st::FaultKind::kShortRead;
            } else if (kind == "slow") {
              r.kind = st::FaultKind::kSlow;
              r.delay_us = delay_us;
            } else {
              throw teraio::Error("inject_fault: kind must be 'error', 'short' or 'slow', got '" + kind + "'");
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
          py::arg("error_code"), py::arg("delay_us") = 0)
      .def("clear_faults", &teraio::Session::clear_faults)
      .def("name_tensor", &teraio::Session::name_tensor)
      .def("names_generation", &teraio::Session::names_generation)
      .def("adopt", &teraio::Session::adopt)
      .def("storage_resizing", &teraio::Session::storage_resizing,
           py::call_guard<py::gil_scoped_release>())
      .def("set_predict_step_in_backward", &teraio::Session::set_predict_step_in_backward)
      .def("stats", [](const teraio::Session& s) { return stats_dict(s.stats()); });
}
