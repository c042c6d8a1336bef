// dblp._native: the trainer's end of the shared-memory hand-off
// (lib/dblp/shm_channel.h), for python/dblp. The same layout code as the
// dblp-worker's end, so the two can never disagree on an offset. Waits
// release the GIL: other Python threads (a DataLoader) run meanwhile.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "dblp/shm_channel.h"

namespace py = pybind11;

namespace {

using dblp::ShmChannel;

py::memoryview FloatView(std::span<float> s) {
  return py::memoryview::from_buffer(s.data(), {s.size()}, {sizeof(float)},
                                     /*readonly=*/false);
}

ShmChannel Create(const std::string& name, uint64_t floats,
                  const std::vector<std::pair<std::string, uint64_t>>& named) {
  std::vector<dblp::ShmLayer> layers(named.size());
  for (size_t i = 0; i < named.size(); ++i) {
    std::strncpy(layers[i].name, named[i].first.c_str(),
                 sizeof(layers[i].name) - 1);
    layers[i].floats = named[i].second;
  }
  return ShmChannel::Create(name, floats, layers);
}

py::dict Info(const ShmChannel& ch) {
  const dblp::ShmIterationInfo& i = ch.header().info;
  py::dict d;
  d["iteration"] = i.iteration;
  d["delivered_fraction"] = i.delivered_fraction;
  d["p"] = i.p;
  d["critical"] = i.critical != 0;
  d["resync"] = i.resync != 0;
  d["burst"] = i.burst != 0;
  d["send_latency_us"] = i.send_latency_us;
  d["bcast_latency_us"] = i.bcast_latency_us;
  d["control_rtt_us"] = i.control_rtt_us;
  d["packets_sent"] = i.packets_sent;
  d["passes"] = i.passes;
  d["trainer_post_ns"] = i.trainer_post_ns;
  d["worker_wake_ns"] = i.worker_wake_ns;
  d["worker_post_ns"] = i.worker_post_ns;
  return d;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "DBLP trainer <-> dblp-worker shared-memory hand-off";
  py::register_exception<std::runtime_error>(m, "ShmError", PyExc_OSError);
  m.def("monotonic_ns", &dblp::MonotonicNs,
        "CLOCK_MONOTONIC in ns (the clock the worker stamps with)");
  m.def("process_alive", [](int pid) { return dblp::ProcessAlive(pid); });
  m.def("region_bytes", &dblp::ShmRegionBytes);
  m.attr("POST_GRADIENT") = static_cast<int>(dblp::ShmPost::kGradient);
  m.attr("POST_MODEL") = static_cast<int>(dblp::ShmPost::kModel);
  m.attr("POST_END") = static_cast<int>(dblp::ShmPost::kEnd);
  m.attr("STATE_STARTING") =
      static_cast<int>(dblp::ShmWorkerState::kStarting);
  m.attr("STATE_JOINED") = static_cast<int>(dblp::ShmWorkerState::kJoined);
  m.attr("STATE_FAILED") = static_cast<int>(dblp::ShmWorkerState::kFailed);
  m.attr("STATE_DONE") = static_cast<int>(dblp::ShmWorkerState::kDone);

  py::class_<ShmChannel>(m, "Channel")
      .def(py::init(&Create), py::arg("name"), py::arg("floats"),
           py::arg("layers") = std::vector<std::pair<std::string, uint64_t>>{},
           "Create /dev/shm/<name> for `floats` float32 values")
      .def_property_readonly("name", &ShmChannel::name)
      .def_property_readonly("floats",
                             [](const ShmChannel& c) { return c.header().floats; })
      .def("gradient", [](const ShmChannel& c) { return FloatView(c.gradient()); })
      .def("mean", [](const ShmChannel& c) { return FloatView(c.mean()); })
      .def("unlink", &ShmChannel::Unlink)
      .def("post",
           [](ShmChannel& c, int kind, uint64_t iteration) {
             c.PostToWorker(static_cast<dblp::ShmPost>(kind), iteration);
           })
      .def_property_readonly(
          "answers",
          [](const ShmChannel& c) {
            return c.header().to_trainer.load(std::memory_order_acquire);
          })
      .def_property_readonly(
          "state",
          [](const ShmChannel& c) {
            return c.header().worker_state.load(std::memory_order_acquire);
          })
      .def(
          "wait_answer",
          [](const ShmChannel& c, uint32_t seen, uint32_t slice_ms) {
            py::gil_scoped_release nogil;
            return ShmChannel::WaitChange(c.header().to_trainer, seen,
                                          slice_ms);
          },
          "True once the answer count differs from `seen` (within slice_ms)")
      .def(
          "wait_state",
          [](const ShmChannel& c, uint32_t seen, uint32_t slice_ms) {
            py::gil_scoped_release nogil;
            return ShmChannel::WaitChange(c.header().worker_state, seen,
                                          slice_ms);
          })
      .def_property_readonly("rank",
                             [](const ShmChannel& c) { return c.header().rank; })
      .def_property_readonly(
          "num_workers",
          [](const ShmChannel& c) { return c.header().num_workers; })
      .def_property_readonly(
          "resync_every",
          [](const ShmChannel& c) { return c.header().resync_every; })
      .def_property_readonly(
          "worker_pid",
          [](const ShmChannel& c) { return c.header().worker_pid; })
      .def_property_readonly(
          "error",
          [](const ShmChannel& c) {
            return std::string(
                c.header().error,
                strnlen(c.header().error, sizeof(c.header().error)));
          })
      .def("info", &Info, "The last answered iteration's row");
}
