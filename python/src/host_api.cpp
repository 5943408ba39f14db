// The host API for Python: _Context, _Window, _Channel over gdx::Context, gdx::Window and gdx::Channel. Every call
// that may block (joining the job, registering a window, flush, wait, barrier, closing) releases the GIL; wait() does
// so in slices of kWaitSliceNs and checks for signals between them, so Ctrl-C ends it within about that long.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "gdx/context.hpp"
#include "gdx/device/channel.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "python/src/bindings.hpp"
#include "python/src/py_objects.hpp"

namespace gdx::python {
namespace {

constexpr uint64_t kMsNs = 1000000ull;
// Longest stretch a wait spends without looking at Python's signal handlers (Ctrl-C must end it within 100 ms).
constexpr uint64_t kWaitSliceNs = 50 * kMsNs;

SignalOp signalOpFrom(const std::string& op) {
  if (op == "add") return SignalOp::kAdd;
  if (op == "set") return SignalOp::kSet;
  throw Error(ErrorCode::kInvalidArgument, "signal op '" + op + "' is neither 'add' nor 'set'");
}

MemoryKind kindFrom(const std::string& kind) {
  if (kind == "host") return MemoryKind::kHost;
  if (kind == "cuda") return MemoryKind::kCuda;
  throw Error(ErrorCode::kInvalidArgument, "memory kind '" + kind + "' is neither 'host' nor 'cuda'");
}

// Context::wait in slices, so that a KeyboardInterrupt raised by Python's SIGINT handler ends it. A status other
// than a timeout (a failed peer) is reported by Context::wait itself, with its message.
void waitInterruptibly(const Context& c, uint32_t id, uint64_t value, uint64_t timeoutNs) {
  const uint64_t bound = timeoutNs ? timeoutNs : c.options().timeoutNs;
  const uint64_t start = nowNs();
  for (;;) {
    const uint64_t elapsed = nowNs() - start;
    if (elapsed >= bound) break;
    Status s;
    {
      py::gil_scoped_release release;
      s = c.waitStatus(id, value, std::min(kWaitSliceNs, bound - elapsed));
    }
    if (s == Status::kOk) return;
    if (s != Status::kTimeout) c.wait(id, value, 1);  // throws the failure's own message
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  throw Error(ErrorCode::kTimeout, "rank " + std::to_string(c.rank()) + ": wait for signal " + std::to_string(id) +
                                       " >= " + std::to_string(value) + " timed out after " +
                                       std::to_string((nowNs() - start) / kMsNs) + " ms; last value seen " +
                                       std::to_string(c.signalValue(id)));
}

py::dict deviceChannelLayout() {
  py::dict d;
  auto field = [&](const char* name, size_t offset, size_t size) { d[name] = py::make_tuple(offset, size); };
  using H = ChannelDeviceHandle;
  field("ring.slots", offsetof(H, ring) + offsetof(RingDeviceHandle, slots), sizeof(void*));
  field("ring.head", offsetof(H, ring) + offsetof(RingDeviceHandle, head), sizeof(void*));
  field("ring.cachedTail", offsetof(H, ring) + offsetof(RingDeviceHandle, cachedTail), sizeof(void*));
  field("ring.tail", offsetof(H, ring) + offsetof(RingDeviceHandle, tail), sizeof(void*));
  field("ring.completed", offsetof(H, ring) + offsetof(RingDeviceHandle, completed), sizeof(void*));
  field("ring.error", offsetof(H, ring) + offsetof(RingDeviceHandle, error), sizeof(void*));
  field("ring.capacity", offsetof(H, ring) + offsetof(RingDeviceHandle, capacity), sizeof(uint64_t));
  field("ring.timeoutNs", offsetof(H, ring) + offsetof(RingDeviceHandle, timeoutNs), sizeof(uint64_t));
  field("signals", offsetof(H, signals), sizeof(void*));
  field("failure", offsetof(H, failure), sizeof(void*));
  field("numSignals", offsetof(H, numSignals), sizeof(uint32_t));
  field("peer", offsetof(H, peer), sizeof(uint32_t));
  field("lastPosition", offsetof(H, lastPosition), sizeof(uint64_t));
  field("direct", offsetof(H, direct), sizeof(void*));
  field("deviceSignals", offsetof(H, deviceSignals), sizeof(void*));
  field("forwardTo", offsetof(H, forwardTo), sizeof(int32_t));
  field("flushFrom", offsetof(H, flushFrom), sizeof(uint64_t));
  field("directSignals", offsetof(H, directSignals), sizeof(void*));
  field("directNumSignals", offsetof(H, directNumSignals), sizeof(uint32_t));
  return d;
}

}  // namespace

void bindHostApi(py::module_& m) {
  m.attr("DEVICE_CHANNEL_SIZE") = sizeof(ChannelDeviceHandle);
  m.attr("DEVICE_CHANNEL_ALIGNMENT") = alignof(ChannelDeviceHandle);
  m.attr("DEVICE_CHANNEL_LAYOUT") = deviceChannelLayout();

  py::class_<PyWindow>(m, "_Window")
      .def_property_readonly("id", [](const PyWindow& w) { return w.window.id(); })
      .def_property_readonly("ptr", [](const PyWindow& w) { return addressOf(w.window.data()); })
      .def_property_readonly("nbytes", [](const PyWindow& w) { return w.window.size(); })
      .def_property_readonly("kind",
                             [](const PyWindow& w) { return w.window.kind() == MemoryKind::kCuda ? "cuda" : "host"; })
      .def_property_readonly("name", [](const PyWindow& w) { return w.window.name(); })
      .def_property_readonly("valid", [](const PyWindow& w) { return w.window.valid(); })
      .def("remote_size", [](const PyWindow& w, int peer) { return w.window.remoteSize(peer); })
      .def("close", &PyWindow::close);

  py::class_<Channel>(m, "_Channel")
      .def_property_readonly("peer", &Channel::peer)
      .def_property_readonly("ring", &Channel::ringIndex)
      .def(
          "put",
          [](Channel& c, const PyWindow& dst, uint64_t dstOffset, const PyWindow& src, uint64_t srcOffset,
             uint64_t bytes) { c.put(dst.window, dstOffset, src.window, srcOffset, bytes); },
          py::call_guard<py::gil_scoped_release>())
      .def("put_with_signal",
           [](Channel& c, const PyWindow& dst, uint64_t dstOffset, const PyWindow& src, uint64_t srcOffset,
              uint64_t bytes, uint32_t signal, uint64_t value, const std::string& op) {
             const SignalOp o = signalOpFrom(op);
             py::gil_scoped_release release;
             c.putWithSignal(dst.window, dstOffset, src.window, srcOffset, bytes, signal, value, o);
           })
      .def("signal",
           [](Channel& c, uint32_t signal, uint64_t value, const std::string& op) {
             const SignalOp o = signalOpFrom(op);
             py::gil_scoped_release release;
             c.signal(signal, value, o);
           })
      .def(
          "atomic_add",
          [](Channel& c, const PyWindow& dst, uint64_t dstOffset, uint64_t value) {
            c.atomicAdd(dst.window, dstOffset, value);
          },
          py::call_guard<py::gil_scoped_release>())
      .def("flush", &Channel::flush, py::call_guard<py::gil_scoped_release>());

  py::class_<PyContext>(m, "_Context")
      .def(py::init([] {
        auto c = std::make_unique<PyContext>();
        py::gil_scoped_release release;
        c->context = std::make_unique<Context>();
        return c;
      }))
      // The Python package's from_process_group / from_store: rank 0 (port 0) publishes its ephemeral rendezvous
      // port through `publish_port`, which runs with the GIL held, on the thread that made the call.
      .def_static(
          "from_config",
          [](int rank, int worldSize, int localRank, const std::string& masterAddr, int masterPort,
             const std::string& secret, uint64_t timeoutMs, std::function<void(int)> publishPort) {
            BootstrapConfig b;
            b.rank = rank;
            b.worldSize = worldSize;
            b.localRank = localRank;
            b.masterAddr = masterAddr;
            b.masterPort = masterPort;
            b.secret = secret;
            b.timeoutNs = timeoutMs * kMsNs;
            b.publishPort = std::move(publishPort);  // pybind11's wrapper takes the GIL to call and to release it
            auto c = std::make_unique<PyContext>();
            py::gil_scoped_release release;
            c->context = std::make_unique<Context>(b, ContextOptions::fromEnv());
            return c;
          },
          py::arg("rank"), py::arg("world_size"), py::arg("local_rank"), py::arg("master_addr"), py::arg("master_port"),
          py::arg("secret"), py::arg("timeout_ms"), py::arg("publish_port"))
      .def_property_readonly("rank", [](const PyContext& c) { return c.get().rank(); })
      .def_property_readonly("world_size", [](const PyContext& c) { return c.get().worldSize(); })
      .def_property_readonly("local_rank", [](const PyContext& c) { return c.get().localRank(); })
      .def_property_readonly("num_signals", [](const PyContext& c) { return c.get().numSignals(); })
      .def_property_readonly("timeout_ms", [](const PyContext& c) { return c.get().options().timeoutNs / kMsNs; })
      .def_property_readonly("transport", [](const PyContext& c) { return c.get().options().transport; })
      .def_property_readonly("has_gpu", [](const PyContext& c) { return c.get().gpu().present(); })
      .def_property_readonly("closed", [](const PyContext& c) { return !c.context; })
      .def("register_window",
           [](PyContext& c, uintptr_t ptr, size_t bytes, const std::string& kind, const std::string& name,
              bool sizesMayDiffer) {
             const MemoryKind k = kindFrom(kind);
             Context& ctx = c.get();
             auto w = std::make_unique<PyWindow>();
             py::gil_scoped_release release;
             w->window = ctx.registerWindow(pointerFrom(ptr), bytes, k, name,
                                            sizesMayDiffer ? WindowSizes::kMayDiffer : WindowSizes::kEqual);
             return w;
           })
      .def(
          "channel", [](PyContext& c, int peer, int ring) { return c.get().channel(peer, ring); }, py::arg("peer"),
          py::arg("ring") = -1)
      .def(
          "device_channel",
          [](PyContext& c, int peer, int ring) {
            ChannelDeviceHandle h = c.get().deviceChannel(peer, ring);
            return py::bytes(reinterpret_cast<const char*>(&h), sizeof h);
          },
          py::arg("peer"), py::arg("ring") = -1)
      .def("wait", [](const PyContext& c, uint32_t signal, uint64_t value,
                      uint64_t timeoutMs) { waitInterruptibly(c.get(), signal, value, timeoutMs * kMsNs); })
      .def("signal_value", [](const PyContext& c, uint32_t signal) { return c.get().signalValue(signal); })
      .def("set_signal", [](PyContext& c, uint32_t signal, uint64_t value) { c.get().setSignal(signal, value); })
      .def("is_direct", [](const PyContext& c, int peer) { return c.get().isDirect(peer); })
      .def("failure", [](const PyContext& c) { return c.get().failure(); })
      .def("barrier",
           [](PyContext& c) {
             Context& ctx = c.get();
             py::gil_scoped_release release;
             ctx.barrier();
           })
      .def("close", &PyContext::close);
}

}  // namespace gdx::python
