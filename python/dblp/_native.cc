// dblp._native: the trainer's end of the shared-memory hand-off
// (lib/dblp/handoff/shm_channel.h), for python/dblp. The same layout code as
// the dblp-worker's end, so the two can never disagree on an offset. Waits
// release the GIL: other Python threads (a DataLoader) run meanwhile.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dblp/handoff/shm_channel.h"

namespace py = pybind11;

namespace {

using dblp::ShmChannel;

// One float array of a channel, exported through the buffer protocol. It
// holds the channel: a tensor made from it (torch.frombuffer keeps the
// exporter alive) can never outlive the mapping.
struct Region {
  std::shared_ptr<ShmChannel> channel;
  bool mean;
  std::span<float> span() const {
    return mean ? channel->mean() : channel->gradient();
  }
};

std::shared_ptr<ShmChannel> Create(
    const std::string& name, uint64_t floats,
    const std::vector<std::pair<std::string, uint64_t>>& named) {
  std::vector<dblp::ShmLayer> layers(named.size());
  for (size_t i = 0; i < named.size(); ++i) {
    // Cut on a UTF-8 character boundary, not inside one.
    std::string n = named[i].first.substr(0, sizeof(layers[i].name) - 1);
    while (!n.empty() && n.size() < named[i].first.size() &&
           (static_cast<unsigned char>(named[i].first[n.size()]) & 0xC0) ==
               0x80) {
      n.pop_back();
    }
    std::memcpy(layers[i].name, n.data(), n.size());
    layers[i].floats = named[i].second;
  }
  return std::make_shared<ShmChannel>(ShmChannel::Create(name, floats, layers));
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
  // Local: a global translator would turn every std::runtime_error of
  // another pybind11 module (torch's c10d store, ...) into ours.
  py::register_local_exception<std::runtime_error>(m, "ShmError",
                                                   PyExc_OSError);
  m.def("monotonic_ns", &dblp::MonotonicNs,
        "CLOCK_MONOTONIC in ns (the clock the worker stamps with)");
  m.def("process_alive", [](int pid) { return dblp::ProcessAlive(pid); });
  m.def("region_bytes", &dblp::ShmRegionBytes);
  m.attr("POST_GRADIENT") = static_cast<int>(dblp::ShmPost::kGradient);
  m.attr("POST_MODEL") = static_cast<int>(dblp::ShmPost::kModel);
  m.attr("POST_END") = static_cast<int>(dblp::ShmPost::kEnd);
  m.attr("POST_ABORT") = static_cast<int>(dblp::ShmPost::kAbort);
  m.attr("STATE_STARTING") = static_cast<int>(dblp::ShmWorkerState::kStarting);
  m.attr("STATE_JOINED") = static_cast<int>(dblp::ShmWorkerState::kJoined);
  m.attr("STATE_FAILED") = static_cast<int>(dblp::ShmWorkerState::kFailed);
  m.attr("STATE_DONE") = static_cast<int>(dblp::ShmWorkerState::kDone);

  py::class_<Region>(m, "Region", py::buffer_protocol())
      .def_buffer([](const Region& r) {
        const std::span<float> s = r.span();
        return py::buffer_info(s.data(), sizeof(float),
                               py::format_descriptor<float>::format(), 1,
                               {s.size()}, {sizeof(float)});
      });

  py::class_<ShmChannel, std::shared_ptr<ShmChannel>>(m, "Channel")
      .def(py::init(&Create), py::arg("name"), py::arg("floats"),
           py::arg("layers") = std::vector<std::pair<std::string, uint64_t>>{},
           "Create /dev/shm/<name> for `floats` float32 values")
      .def_property_readonly("name", &ShmChannel::name)
      .def_property_readonly("floats",
                             [](const ShmChannel& c) { return c.floats(); })
      .def("gradient",
           [](const std::shared_ptr<ShmChannel>& c) {
             return Region{c, false};
           })
      .def("mean",
           [](const std::shared_ptr<ShmChannel>& c) {
             return Region{c, true};
           })
      .def("unlink", &ShmChannel::Unlink)
      .def("post",
           [](ShmChannel& c, int kind, uint64_t iteration) {
             c.PostToWorker(static_cast<dblp::ShmPost>(kind), iteration);
           })
      .def("post_abort", &ShmChannel::PostAbort, py::arg("why"),
           py::arg("iteration"),
           "End the job on the trainer's error `why` (no BYE)")
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
      .def("wait_state",
           [](const ShmChannel& c, uint32_t seen, uint32_t slice_ms) {
             py::gil_scoped_release nogil;
             return ShmChannel::WaitChange(c.header().worker_state, seen,
                                           slice_ms);
           })
      .def_property_readonly(
          "rank", [](const ShmChannel& c) { return c.header().rank; })
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
