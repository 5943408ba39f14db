// The MoE low-latency mode for Python: gdx::ep::LowLatencyBuffer with its argument structs, handle and hook, under
// gdx._gdx.ep. Pointers are Python ints, streams cudaStream_t values as ints; gdx/ep/buffer.py gives it DeepEP's
// names (low_latency_dispatch / low_latency_combine / return_recv_hook). Construction waits on the host and
// releases the GIL; the calls only launch kernels (no host synchronisation, so they can be captured in CUDA graphs).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "python/src/bindings.hpp"
#include "python/src/py_objects.hpp"

#if GDX_HAVE_CUDA
#include <memory>

#include "gdx/ep/low_latency.hpp"
#include "python/src/ep_bindings.hpp"
#endif

namespace gdx::python {

#if GDX_HAVE_CUDA
void bindEpLowLatency(py::module_& ep) {
  py::class_<ep::LowLatencyConfig>(ep, "LowLatencyConfig")
      .def(py::init<>())
      .def_readwrite("max_tokens_per_rank", &ep::LowLatencyConfig::maxTokensPerRank)
      .def_readwrite("hidden", &ep::LowLatencyConfig::hidden)
      .def_readwrite("num_experts", &ep::LowLatencyConfig::numExperts)
      .def_readwrite("max_topk", &ep::LowLatencyConfig::maxTopk)
      .def_readwrite("num_sms", &ep::LowLatencyConfig::numSms)
      .def_readwrite("num_threads", &ep::LowLatencyConfig::numThreads)
      .def_readwrite("programmatic_launch", &ep::LowLatencyConfig::programmaticLaunch)
      .def_readwrite("next_kernel_early", &ep::LowLatencyConfig::nextKernelEarly);
  ep.def(
      "low_latency_bytes_hint",
      [](const ep::LowLatencyConfig& c, int numRanks, int numRemoteRanks) {
        const ep::LowLatencyBytes b = ep::lowLatencyBytesHint(c, numRanks, numRemoteRanks);
        return std::make_pair(b.gpu, b.host);
      },
      "(GPU bytes, pinned host bytes) a LowLatencyBuffer of this shape takes with numRemoteRanks on other hosts.");

  // Constructors taking every field, as the normal mode's structs (ep_api.cpp): one call fills one.
  py::class_<ep::LowLatencyDispatchInputs> in(ep, "LowLatencyDispatchInputs");
  in.def(py::init([](uintptr_t x, uintptr_t topkIdx, int numTokens, int numTopk, bool useFp8, bool roundScale,
                     bool useUe8m0) {
           ep::LowLatencyDispatchInputs i;
           i.x = typedPointer<const void>(x);
           i.topkIdx = typedPointer<const int64_t>(topkIdx);
           i.numTokens = numTokens;
           i.numTopk = numTopk;
           i.useFp8 = useFp8;
           i.roundScale = roundScale;
           i.useUe8m0 = useUe8m0;
           return i;
         }),
         py::arg("x"), py::arg("topk_idx"), py::arg("num_tokens"), py::arg("num_topk"), py::arg("use_fp8"),
         py::arg("round_scale"), py::arg("use_ue8m0") = false)
      .def(py::init<>())
      .def_readwrite("num_tokens", &ep::LowLatencyDispatchInputs::numTokens)
      .def_readwrite("num_topk", &ep::LowLatencyDispatchInputs::numTopk)
      .def_readwrite("use_fp8", &ep::LowLatencyDispatchInputs::useFp8)
      .def_readwrite("round_scale", &ep::LowLatencyDispatchInputs::roundScale)
      .def_readwrite("use_ue8m0", &ep::LowLatencyDispatchInputs::useUe8m0);
  pointerField(in, "x", &ep::LowLatencyDispatchInputs::x);
  pointerField(in, "topk_idx", &ep::LowLatencyDispatchInputs::topkIdx);

  py::class_<ep::LowLatencyDispatchOutputs> out(ep, "LowLatencyDispatchOutputs");
  // recv_x_scales: f32 memory [L, H / 128, T * R], or with use_ue8m0 int32 [L, H / 512, T * R] (DeepEP's layouts,
  // handed out transposed; see LowLatencyDispatchOutputs). The stats are optional (0: none).
  out.def(py::init([](uintptr_t recvX, uintptr_t recvXScales, uintptr_t recvCount, uintptr_t cumulativeStats,
                      uintptr_t waitCostStats) {
            ep::LowLatencyDispatchOutputs o;
            o.recvX = typedPointer<void>(recvX);
            o.recvXScales = typedPointer<void>(recvXScales);
            o.recvCount = typedPointer<int32_t>(recvCount);
            o.cumulativeRecvStats = typedPointer<int32_t>(cumulativeStats);
            o.waitRecvCostStats = typedPointer<int64_t>(waitCostStats);
            return o;
          }),
          py::arg("recv_x"), py::arg("recv_x_scales"), py::arg("recv_count"),
          py::arg("cumulative_local_expert_recv_stats") = 0, py::arg("wait_recv_cost_stats") = 0)
      .def(py::init<>());
  pointerField(out, "recv_x", &ep::LowLatencyDispatchOutputs::recvX);
  pointerField(out, "recv_x_scales", &ep::LowLatencyDispatchOutputs::recvXScales);
  pointerField(out, "recv_count", &ep::LowLatencyDispatchOutputs::recvCount);
  pointerField(out, "cumulative_local_expert_recv_stats", &ep::LowLatencyDispatchOutputs::cumulativeRecvStats);
  pointerField(out, "wait_recv_cost_stats", &ep::LowLatencyDispatchOutputs::waitRecvCostStats);

  py::class_<ep::LowLatencyCombineInputs> cin(ep, "LowLatencyCombineInputs");
  cin.def(py::init([](uintptr_t x, uintptr_t topkIdx, uintptr_t topkWeights, uintptr_t waitCostStats) {
            ep::LowLatencyCombineInputs i;
            i.x = typedPointer<const void>(x);
            i.topkIdx = typedPointer<const int64_t>(topkIdx);
            i.topkWeights = typedPointer<const float>(topkWeights);
            i.waitRecvCostStats = typedPointer<int64_t>(waitCostStats);
            return i;
          }),
          py::arg("x"), py::arg("topk_idx"), py::arg("topk_weights"), py::arg("wait_recv_cost_stats") = 0)
      .def(py::init<>());
  pointerField(cin, "x", &ep::LowLatencyCombineInputs::x);
  pointerField(cin, "topk_idx", &ep::LowLatencyCombineInputs::topkIdx);
  pointerField(cin, "topk_weights", &ep::LowLatencyCombineInputs::topkWeights);
  pointerField(cin, "wait_recv_cost_stats", &ep::LowLatencyCombineInputs::waitRecvCostStats);

  py::class_<ep::LowLatencyHandle>(ep, "LowLatencyHandle")
      .def_property_readonly("src_info", [](const ep::LowLatencyHandle& h) { return addressOf(h.srcInfo()); })
      .def_property_readonly("src_slot", [](const ep::LowLatencyHandle& h) { return addressOf(h.srcSlot()); })
      .def_property_readonly("layout_range", [](const ep::LowLatencyHandle& h) { return addressOf(h.layoutRange()); })
      .def_property_readonly("num_tokens", &ep::LowLatencyHandle::numTokens)
      .def_property_readonly("num_topk", &ep::LowLatencyHandle::numTopk)
      .def_property_readonly("address", [](const ep::LowLatencyHandle& h) { return addressOf(&h); });

  py::class_<ep::LowLatencyHook>(ep, "LowLatencyHook")
      .def(py::init<>())
      .def_property_readonly("pending", &ep::LowLatencyHook::pending)
      .def("run", [](ep::LowLatencyHook& h, uintptr_t stream) { h.run(streamFrom(stream)); })
      .def_property_readonly("address", [](const ep::LowLatencyHook& h) { return addressOf(&h); });

  // Keeps the _Context alive (keep_alive): the buffer holds a reference to it.
  py::class_<ep::LowLatencyBuffer>(ep, "LowLatencyBuffer")
      .def(py::init([](PyContext& context, const ep::LowLatencyConfig& config) {
             Context& ctx = context.get();
             py::gil_scoped_release release;
             return std::make_unique<ep::LowLatencyBuffer>(ctx, config);
           }),
           py::keep_alive<1, 2>())
      .def_property_readonly("rank", &ep::LowLatencyBuffer::rank)
      .def_property_readonly("num_ranks", &ep::LowLatencyBuffer::numRanks)
      .def_property_readonly("num_local_experts", &ep::LowLatencyBuffer::numLocalExperts)
      .def_property_readonly("config", &ep::LowLatencyBuffer::config)
      .def("new_handle", &ep::LowLatencyBuffer::newHandle)
      .def(
          "dispatch",
          [](ep::LowLatencyBuffer& b, const ep::LowLatencyDispatchInputs& in, const ep::LowLatencyDispatchOutputs& o,
             ep::LowLatencyHandle& h, uintptr_t stream,
             ep::LowLatencyHook* hook) { b.lowLatencyDispatch(in, o, h, streamFrom(stream), hook); },
          py::arg("inputs"), py::arg("outputs"), py::arg("handle"), py::arg("stream"), py::arg("hook") = nullptr)
      .def(
          "combine",
          [](ep::LowLatencyBuffer& b, const ep::LowLatencyCombineInputs& in, const ep::LowLatencyHandle& h,
             uintptr_t combined, uintptr_t stream,
             ep::LowLatencyHook* hook) { b.lowLatencyCombine(in, h, pointerFrom(combined), streamFrom(stream), hook); },
          py::arg("inputs"), py::arg("handle"), py::arg("combined"), py::arg("stream"), py::arg("hook") = nullptr)
      // Both calls with every field as an argument: one crossing each, for the pointer path of gdx/ep/low_latency.py
      // (its host time is what the GPU waits for at small token counts).
      .def("dispatch_flat",
           [](ep::LowLatencyBuffer& b, uintptr_t x, uintptr_t topkIdx, int numTokens, int numTopk, bool useFp8,
              bool roundScale, bool useUe8m0, uintptr_t recvX, uintptr_t recvXScales, uintptr_t recvCount,
              uintptr_t cumulativeStats, uintptr_t waitStats, ep::LowLatencyHandle& h, uintptr_t stream,
              ep::LowLatencyHook* hook) {
             ep::LowLatencyDispatchInputs in;
             in.x = typedPointer<const void>(x);
             in.topkIdx = typedPointer<const int64_t>(topkIdx);
             in.numTokens = numTokens;
             in.numTopk = numTopk;
             in.useFp8 = useFp8;
             in.roundScale = roundScale;
             in.useUe8m0 = useUe8m0;
             ep::LowLatencyDispatchOutputs o;
             o.recvX = typedPointer<void>(recvX);
             o.recvXScales = typedPointer<void>(recvXScales);
             o.recvCount = typedPointer<int32_t>(recvCount);
             o.cumulativeRecvStats = typedPointer<int32_t>(cumulativeStats);
             o.waitRecvCostStats = typedPointer<int64_t>(waitStats);
             b.lowLatencyDispatch(in, o, h, streamFrom(stream), hook);
           })
      .def("combine_flat",
           [](ep::LowLatencyBuffer& b, uintptr_t x, uintptr_t topkIdx, uintptr_t topkWeights, uintptr_t combined,
              uintptr_t waitStats, const ep::LowLatencyHandle& h, uintptr_t stream, ep::LowLatencyHook* hook) {
             ep::LowLatencyCombineInputs in;
             in.x = typedPointer<const void>(x);
             in.topkIdx = typedPointer<const int64_t>(topkIdx);
             in.topkWeights = typedPointer<const float>(topkWeights);
             in.waitRecvCostStats = typedPointer<int64_t>(waitStats);
             b.lowLatencyCombine(in, h, pointerFrom(combined), streamFrom(stream), hook);
           })
      .def("local_buffer",
           [](const ep::LowLatencyBuffer& b) { return std::make_pair(addressOf(b.localMemory()), b.localBytes()); })
      // The C++ object, for gdx._gdx_torch (a module of its own pybind11, which cannot take this class).
      .def_property_readonly("address", [](const ep::LowLatencyBuffer& b) { return addressOf(&b); })
      .def("masked_ranks", &ep::LowLatencyBuffer::maskedRanks)
      // Shrink mode (DeepEP's low_latency_update_mask_buffer / _query_mask_buffer / _clean_mask_buffer), ordered on
      // `stream`; query_mask writes int32 [num_ranks] (1: masked) to device memory at `out`.
      .def(
          "update_mask",
          [](ep::LowLatencyBuffer& b, int rank, bool masked, uintptr_t stream) {
            b.updateMask(rank, masked, streamFrom(stream));
          },
          py::arg("rank"), py::arg("masked"), py::arg("stream"))
      .def(
          "query_mask",
          [](const ep::LowLatencyBuffer& b, uintptr_t out, uintptr_t stream) {
            b.queryMask(typedPointer<int32_t>(out), streamFrom(stream));
          },
          py::arg("out"), py::arg("stream"))
      .def(
          "clean_mask", [](ep::LowLatencyBuffer& b, uintptr_t stream) { b.cleanMask(streamFrom(stream)); },
          py::arg("stream"))
      .def("check_errors", &ep::LowLatencyBuffer::checkErrors);
}

#else

void bindEpLowLatency(py::module_&) {}

#endif

}  // namespace gdx::python
