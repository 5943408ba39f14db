// The P2P layer for Python: _Endpoint over gdx::p2p::Endpoint, _UrlTransport / _RegisteredMemory / _Future over
// gdx::p2p::UrlTransport. Pointers and sizes only (python/gdx/p2p/ turns arrays into them). Every call that may block
// releases the GIL. Blocking transfers run as the endpoint's async form waited for in slices of kSliceNs, with
// Python's signal handlers run between slices, so that Ctrl-C ends them (KeyboardInterrupt) within about that long;
// the interrupted transfer itself goes on in the background (the Python layer keeps its memory alive).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/timer_slack.hpp"
#include "gdx/config.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "gdx/p2p/endpoint.hpp"
#include "gdx/p2p/url_transport.hpp"
#include "gdx/status.hpp"
#include "p2p/protocol.hpp"
#include "python/src/bindings.hpp"

namespace gdx::python {
namespace {

using p2p::Endpoint;
using p2p::Iov;

constexpr uint64_t kMsNs = 1000000ull;
// Longest stretch a wait spends without running Python's signal handlers (Ctrl-C must end it within 100 ms).
constexpr uint64_t kSliceNs = 50 * kMsNs;
// Polls spent yielding before a waiting thread starts sleeping between polls: small transfers finish within them,
// so their latency is not a sleep's; long ones leave the cores to the endpoint's progress threads.
constexpr int kSpinPolls = 2000;
constexpr auto kPollSleep = std::chrono::microseconds(20);

std::vector<Iov> iovsFrom(const std::vector<uint64_t>& mrIds, const std::vector<uintptr_t>& ptrs,
                          const std::vector<size_t>& sizes, const char* op) {
  if (mrIds.size() != ptrs.size() || ptrs.size() != sizes.size())
    throw Error(ErrorCode::kInvalidArgument,
                std::string(op) + ": " + std::to_string(mrIds.size()) + " mr ids, " + std::to_string(ptrs.size()) +
                    " pointers and " + std::to_string(sizes.size()) + " sizes; the lists must be equally long");
  std::vector<Iov> iovs(mrIds.size());
  for (size_t i = 0; i < iovs.size(); ++i) iovs[i] = Iov{mrIds[i], pointerFrom(ptrs[i]), sizes[i]};
  return iovs;
}

// An Endpoint and the bound of its waits (EndpointOptions::timeoutNs), which the sliced wait needs.
struct PyEndpoint {
  std::shared_ptr<Endpoint> ep;  // shared: an accept() between its slices keeps it alive past a close()
  uint64_t timeoutNs = 0;
  ~PyEndpoint() {
    if (!ep) return;
    py::gil_scoped_release release;  // its destructor joins threads
    ep.reset();
  }
};

// The endpoint, held for the call: calls run with the GIL released, so close() from another Python thread may drop
// the PyEndpoint's reference meanwhile; both sides use the atomic shared_ptr functions.
std::shared_ptr<Endpoint> live(const PyEndpoint& e) {
  std::shared_ptr<Endpoint> ep = std::atomic_load(&e.ep);
  if (!ep) throw Error(ErrorCode::kShutdown, "this gdx.p2p.Endpoint was closed");
  return ep;
}

// Endpoint::wait(id) in slices (see the top of the file), at most `timeoutNs` (0: the endpoint's bound). Past the
// endpoint's bound, Endpoint::wait itself reports the transfer (its error names the connection and what it waited
// for), since it measures that bound from the transfer's start. Returns the sizes a receive got (Endpoint::poll).
std::vector<size_t> waitTransfer(PyEndpoint& e, uint64_t id, uint64_t timeoutNs) {
  const uint64_t bound = timeoutNs ? std::min(timeoutNs, e.timeoutNs) : e.timeoutNs;
  const uint64_t start = nowNs();
  int polls = 0;
  std::vector<size_t> received;
  const std::shared_ptr<Endpoint> ep = live(e);  // one reference for the whole wait
  for (;;) {
    bool done = false;
    {
      py::gil_scoped_release release;
      Napper napper;  // the naps end on time (base/timer_slack.hpp), the caller's slack comes back
      const uint64_t sliceEnd = nowNs() + kSliceNs;
      while (!(done = ep->poll(id, &received)) && nowNs() < sliceEnd) {
        if (++polls < kSpinPolls)
          std::this_thread::yield();
        else
          napper.nap(kPollSleep);
      }
    }
    if (done) return received;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    const uint64_t elapsed = nowNs() - start;
    if (elapsed < bound) continue;
    if (bound == e.timeoutNs) {
      py::gil_scoped_release release;
      ep->wait(id, &received);  // throws the endpoint's own timeout (or failure) error, or returns if it finished
      return received;
    }
    throw Error(ErrorCode::kTimeout, "p2p transfer " + std::to_string(id) + " not done after " +
                                         std::to_string(elapsed / kMsNs) + " ms (timeout " +
                                         std::to_string(timeoutNs / kMsNs) +
                                         " ms); it goes on: wait for it again or poll it");
  }
}

// Starts an async transfer (GIL released) and waits for it interruptibly; the sizes a receive got.
template <typename Start>
std::vector<size_t> runBlocking(PyEndpoint& e, Start start) {
  uint64_t id;
  {
    py::gil_scoped_release release;
    id = start();
  }
  return waitTransfer(e, id, 0);
}

// A std::future<Status> from UrlTransport, made waitable in slices (so Ctrl-C ends a wait) and pollable: the
// transport's futures are deferred (they do their waiting in get()), so a thread of this object calls get() and
// publishes the status. The Python WriteFuture holds the RdmaTransport, so the transport outlives the thread; the
// destructor joins it (bounded: the transport resolves every future within GDX_TIMEOUT_MS).
class PyFuture {
 public:
  explicit PyFuture(std::future<Status> f) : thread_([this, f = std::move(f)]() mutable { publish(f.get()); }) {}
  ~PyFuture() {
    py::gil_scoped_release release;
    thread_.join();
  }

  bool done() {
    std::lock_guard<std::mutex> lock(mutex_);
    return ready_;
  }
  // The status's name ("ok", "timeout", ...), or None when `timeoutNs` (0: none) passed first.
  py::object wait(uint64_t timeoutNs) {
    const uint64_t start = nowNs();
    for (;;) {
      {
        py::gil_scoped_release release;
        uint64_t slice = kSliceNs;
        if (timeoutNs) slice = std::min(slice, timeoutNs - std::min(timeoutNs, nowNs() - start));
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait_for(lock, std::chrono::nanoseconds(slice), [&] { return ready_; });
        if (ready_) break;
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (timeoutNs && nowNs() - start >= timeoutNs) return py::none();
    }
    return py::str(statusName(status_));
  }

 private:
  void publish(Status s) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      status_ = s;
      ready_ = true;
    }
    cv_.notify_all();
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  bool ready_ = false;
  Status status_ = Status::kOk;
  std::thread thread_;  // last: it starts in the constructor and uses the members above
};

void bindEndpoint(py::module_& m) {
  py::class_<PyEndpoint>(m, "_Endpoint")
      .def(py::init([](int localGpu, int numCpus, int port, const std::string& bindAddress,
                       const std::string& transport, uint64_t timeoutMs, const std::string& secret) {
             p2p::EndpointOptions o = p2p::EndpointOptions::fromEnv(localGpu, numCpus);
             o.port = port;
             o.bindAddress = bindAddress;
             if (!transport.empty()) o.transport = transport;
             if (timeoutMs) o.timeoutNs = timeoutMs * kMsNs;
             o.secret = secret;
             auto e = std::make_unique<PyEndpoint>();
             e->timeoutNs = o.timeoutNs ? o.timeoutNs : defaultTimeoutNs();
             py::gil_scoped_release release;
             e->ep = std::make_unique<Endpoint>(o);
             return e;
           }),
           py::arg("local_gpu"), py::arg("num_cpus"), py::arg("port"), py::arg("bind_address"), py::arg("transport"),
           py::arg("timeout_ms"), py::arg("secret") = "")
      .def_property_readonly("port", [](const PyEndpoint& e) { return live(e)->port(); })
      .def_property_readonly("ip", [](const PyEndpoint& e) { return live(e)->ip(); })
      .def_property_readonly("local_gpu", [](const PyEndpoint& e) { return live(e)->localGpu(); })
      .def_property_readonly("transport", [](const PyEndpoint& e) { return live(e)->transport(); })
      .def(
          "close_connection", [](PyEndpoint& e, uint64_t c) { live(e)->close(c); },
          py::call_guard<py::gil_scoped_release>())
      .def("connection_transport", [](PyEndpoint& e, uint64_t c) { return live(e)->connectionTransport(c); })
      .def(
          "connect",
          [](PyEndpoint& e, const std::string& ip, int gpu, int port) { return live(e)->connect(ip, gpu, port); },
          py::call_guard<py::gil_scoped_release>())
      // Without a bound: slices of tryAccept, between which Ctrl-C and a close() from another thread end it.
      .def("accept",
           [](PyEndpoint& e) {
             p2p::Accepted a;
             for (;;) {
               std::shared_ptr<Endpoint> ep = std::atomic_load(&e.ep);
               if (!ep) throw Error(ErrorCode::kShutdown, "accept: this gdx.p2p.Endpoint was closed");
               bool got = false;
               {
                 py::gil_scoped_release release;
                 got = ep->tryAccept(kSliceNs / kMsNs, &a);
                 ep.reset();  // the last owner after a close(): the endpoint goes here, without the GIL
               }
               if (got) break;
               if (PyErr_CheckSignals() != 0) throw py::error_already_set();
             }
             return py::make_tuple(a.ip, a.remoteGpu, a.connId);
           })
      .def(
          "start_passive_accept", [](PyEndpoint& e) { live(e)->startPassiveAccept(); },
          py::call_guard<py::gil_scoped_release>())
      .def("metadata", [](const PyEndpoint& e) { return py::bytes(live(e)->metadata()); })
      .def(
          "add_remote_endpoint", [](PyEndpoint& e, const std::string& md) { return live(e)->addRemoteEndpoint(md); },
          py::call_guard<py::gil_scoped_release>())
      .def("reg", [](PyEndpoint& e, uintptr_t ptr, size_t size) { return live(e)->reg(pointerFrom(ptr), size); })
      .def("dereg", [](PyEndpoint& e, uint64_t mr) { live(e)->dereg(mr); })
      // Two-sided.
      .def("send", [](PyEndpoint& e, uint64_t c, uint64_t mr, uintptr_t p,
                      size_t n) { runBlocking(e, [&] { return live(e)->sendAsync(c, mr, pointerFrom(p), n); }); })
      // A receive returns the size of the message it got (recvv: one per buffer).
      .def("recv",
           [](PyEndpoint& e, uint64_t c, uint64_t mr, uintptr_t p, size_t n) {
             const std::vector<size_t> got =
                 runBlocking(e, [&] { return live(e)->recvAsync(c, mr, pointerFrom(p), n); });
             return got.empty() ? size_t{0} : got[0];
           })
      .def("sendv",
           [](PyEndpoint& e, uint64_t c, const std::vector<uint64_t>& mrs, const std::vector<uintptr_t>& ptrs,
              const std::vector<size_t>& sizes) {
             std::vector<Iov> iovs = iovsFrom(mrs, ptrs, sizes, "sendv");
             runBlocking(e, [&] { return live(e)->sendvAsync(c, iovs); });
           })
      .def("recvv",
           [](PyEndpoint& e, uint64_t c, const std::vector<uint64_t>& mrs, const std::vector<uintptr_t>& ptrs,
              const std::vector<size_t>& sizes) {
             std::vector<Iov> iovs = iovsFrom(mrs, ptrs, sizes, "recvv");
             return runBlocking(e, [&] { return live(e)->recvvAsync(c, iovs); });
           })
      .def(
          "send_async",
          [](PyEndpoint& e, uint64_t c, uint64_t mr, uintptr_t p, size_t n) {
            return live(e)->sendAsync(c, mr, pointerFrom(p), n);
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "recv_async",
          [](PyEndpoint& e, uint64_t c, uint64_t mr, uintptr_t p, size_t n) {
            return live(e)->recvAsync(c, mr, pointerFrom(p), n);
          },
          py::call_guard<py::gil_scoped_release>())
      .def("sendv_async",
           [](PyEndpoint& e, uint64_t c, const std::vector<uint64_t>& mrs, const std::vector<uintptr_t>& ptrs,
              const std::vector<size_t>& sizes) {
             std::vector<Iov> iovs = iovsFrom(mrs, ptrs, sizes, "sendv_async");
             py::gil_scoped_release release;
             return live(e)->sendvAsync(c, iovs);
           })
      .def("recvv_async",
           [](PyEndpoint& e, uint64_t c, const std::vector<uint64_t>& mrs, const std::vector<uintptr_t>& ptrs,
              const std::vector<size_t>& sizes) {
             std::vector<Iov> iovs = iovsFrom(mrs, ptrs, sizes, "recvv_async");
             py::gil_scoped_release release;
             return live(e)->recvvAsync(c, iovs);
           })
      // (done, the sizes a receive got: one per buffer once done, else empty) and, from wait, those sizes.
      .def(
          "poll",
          [](PyEndpoint& e, uint64_t id) {
            std::vector<size_t> received;
            const bool done = live(e)->poll(id, &received);
            return std::make_pair(done, received);
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "wait", [](PyEndpoint& e, uint64_t id, uint64_t timeoutMs) { return waitTransfer(e, id, timeoutMs * kMsNs); },
          py::arg("transfer_id"), py::arg("timeout_ms") = 0)
      // One-sided. Descriptors are bytes (they are binary).
      .def("advertise", [](PyEndpoint& e, uint64_t c, uint64_t mr, uintptr_t p,
                           size_t n) { return py::bytes(live(e)->advertise(c, mr, pointerFrom(p), n)); })
      .def("write",
           [](PyEndpoint& e, uint64_t c, uint64_t mr, uintptr_t p, size_t n, const std::string& desc, uint64_t off) {
             runBlocking(e, [&] { return live(e)->writeAsync(c, mr, pointerFrom(p), n, desc, off); });
           })
      .def("read",
           [](PyEndpoint& e, uint64_t c, uint64_t mr, uintptr_t p, size_t n, const std::string& desc, uint64_t off) {
             runBlocking(e, [&] { return live(e)->readAsync(c, mr, pointerFrom(p), n, desc, off); });
           })
      .def(
          "write_async",
          [](PyEndpoint& e, uint64_t c, uint64_t mr, uintptr_t p, size_t n, const std::string& desc, uint64_t off) {
            return live(e)->writeAsync(c, mr, pointerFrom(p), n, desc, off);
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "read_async",
          [](PyEndpoint& e, uint64_t c, uint64_t mr, uintptr_t p, size_t n, const std::string& desc, uint64_t off) {
            return live(e)->readAsync(c, mr, pointerFrom(p), n, desc, off);
          },
          py::call_guard<py::gil_scoped_release>())
      .def("writev",
           [](PyEndpoint& e, uint64_t c, const std::vector<uint64_t>& mrs, const std::vector<uintptr_t>& ptrs,
              const std::vector<size_t>& sizes, const std::vector<std::string>& descs) {
             std::vector<Iov> iovs = iovsFrom(mrs, ptrs, sizes, "writev");
             py::gil_scoped_release release;
             live(e)->writev(c, iovs, descs);
           })
      .def("readv",
           [](PyEndpoint& e, uint64_t c, const std::vector<uint64_t>& mrs, const std::vector<uintptr_t>& ptrs,
              const std::vector<size_t>& sizes, const std::vector<std::string>& descs) {
             std::vector<Iov> iovs = iovsFrom(mrs, ptrs, sizes, "readv");
             py::gil_scoped_release release;
             live(e)->readv(c, iovs, descs);
           })
      // Same host, GPU to GPU (CUDA IPC).
      .def("advertise_ipc", [](PyEndpoint& e, uint64_t mr, uintptr_t p,
                               size_t n) { return py::bytes(live(e)->advertiseIpc(mr, pointerFrom(p), n)); })
      .def(
          "write_ipc",
          [](PyEndpoint& e, uintptr_t p, size_t n, const std::string& desc, uint64_t off) {
            live(e)->writeIpc(pointerFrom(p), n, desc, off);
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "read_ipc",
          [](PyEndpoint& e, uintptr_t p, size_t n, const std::string& desc,
             uint64_t off) { live(e)->readIpc(pointerFrom(p), n, desc, off); },
          py::call_guard<py::gil_scoped_release>())
      .def("close", [](PyEndpoint& e) {
        std::shared_ptr<Endpoint> ep = std::atomic_exchange(&e.ep, std::shared_ptr<Endpoint>());
        py::gil_scoped_release release;
        ep.reset();  // stops the progress threads and closes the connections (or the accept() holding it will)
      });
}

void bindUrlTransport(py::module_& m) {
  py::class_<PyFuture>(m, "_Future")
      .def("done", &PyFuture::done)
      .def(
          "wait", [](PyFuture& f, uint64_t timeoutMs) { return f.wait(timeoutMs * kMsNs); }, py::arg("timeout_ms"));

  py::class_<p2p::RegisteredMemory>(m, "_RegisteredMemory")
      .def(py::init([](uintptr_t ptr, size_t len, int cudaDev) {
             return std::make_unique<p2p::RegisteredMemory>(pointerFrom(ptr), len, cudaDev);
           }),
           py::arg("ptr"), py::arg("nbytes"), py::arg("cuda_dev"))
      .def_property_readonly("ptr", [](const p2p::RegisteredMemory& r) { return addressOf(r.data()); })
      .def_property_readonly("nbytes", &p2p::RegisteredMemory::size)
      .def_property_readonly("device", &p2p::RegisteredMemory::device)
      .def("remote_key", [](const p2p::RegisteredMemory& r) { return py::bytes(r.remoteKey()); })
      .def("local_key", [](const p2p::RegisteredMemory& r) { return addressOf(r.localKey()); })
      .def("contains",
           [](const p2p::RegisteredMemory& r, uintptr_t p, size_t n) { return r.contains(pointerFrom(p), n); });

  py::class_<p2p::UrlTransport>(m, "_UrlTransport")
      .def(py::init([](int cudaDev, const std::string& transport) {
        py::gil_scoped_release release;
        return std::make_unique<p2p::UrlTransport>(cudaDev, transport);
      }))
      .def_static("supported", &p2p::UrlTransport::supported, py::arg("transport") = "")
      .def("bind", &p2p::UrlTransport::bind, py::call_guard<py::gil_scoped_release>())
      .def("connect", &p2p::UrlTransport::connect, py::call_guard<py::gil_scoped_release>())
      .def("start_connect", &p2p::UrlTransport::startConnect, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("connected", &p2p::UrlTransport::connected)
      .def("write",
           [](p2p::UrlTransport& t, const p2p::RegisteredMemory& mem, uintptr_t ptr, size_t n, uintptr_t remotePtr,
              const std::string& key, bool notify) {
             p2p::RegisteredMemory::View v = mem.viewAt(pointerFrom(ptr), n);  // throws when outside `mem`
             p2p::RemoteBuffer remote{pointerFrom(remotePtr), key};
             std::future<Status> f;
             {
               py::gil_scoped_release release;
               f = t.write(v, remote, notify);
             }
             return std::make_unique<PyFuture>(std::move(f));
           })
      .def("wait_for_write", [](p2p::UrlTransport& t) {
        std::future<Status> f;
        {
          py::gil_scoped_release release;
          f = t.waitForWrite();
        }
        return std::make_unique<PyFuture>(std::move(f));
      });
}

}  // namespace

void bindP2p(py::module_& m) {
  m.attr("P2P_DESCRIPTOR_BYTES") = p2p::kDescriptorBytes;  // what advertise() returns is exactly this long
  bindEndpoint(m);
  bindUrlTransport(m);
}

}  // namespace gdx::python
