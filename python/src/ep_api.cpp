// The MoE layer for Python: _EpBuffer over gdx::ep::Buffer, with its argument structs. Pointers are Python ints,
// streams are cudaStream_t values as ints (torch.cuda.Stream.cuda_stream); gdx/ep/buffer.py gives it DeepEP's names.
// Calls that wait on the host (construction, dispatch_prepare) release the GIL; the others only launch kernels.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "python/src/bindings.hpp"
#include "python/src/py_objects.hpp"

#if GDX_HAVE_CUDA
#include <memory>

#include "gdx/ep/buffer.hpp"
#include "python/src/ep_bindings.hpp"
#endif

namespace gdx::python {

#if GDX_HAVE_CUDA
namespace {
// The dispatch structs from every field (pointers as ints; 0: null), for their constructors and dispatch_flat.
ep::DispatchInputs dispatchInputsOf(uintptr_t x, uintptr_t xScales, int numTokens, int hidden, ep::DType dtype,
                                    uintptr_t topkIdx = 0, uintptr_t topkWeights = 0, int numTopk = 0,
                                    int numExperts = 0, uintptr_t isTokenInRank = 0, uintptr_t numTokensPerExpert = 0) {
  ep::DispatchInputs i;
  i.x = typedPointer<const void>(x);
  i.xScales = typedPointer<const float>(xScales);
  i.topkIdx = typedPointer<const int64_t>(topkIdx);
  i.topkWeights = typedPointer<const float>(topkWeights);
  i.numTokens = numTokens;
  i.hidden = hidden;
  i.numTopk = numTopk;
  i.numExperts = numExperts;
  i.dtype = dtype;
  i.isTokenInRank = typedPointer<const bool>(isTokenInRank);
  i.numTokensPerExpert = typedPointer<const int32_t>(numTokensPerExpert);
  return i;
}
ep::DispatchOutputs dispatchOutputsOf(int capacity, uintptr_t recvX, uintptr_t recvXScales = 0,
                                      uintptr_t recvTopkIdx = 0, uintptr_t recvTopkWeights = 0,
                                      uintptr_t recvSrcIdx = 0, uintptr_t numRecvTokensPerExpert = 0,
                                      uintptr_t numRecvTokens = 0) {
  ep::DispatchOutputs o;
  o.capacity = capacity;
  o.recvX = typedPointer<void>(recvX);
  o.recvXScales = typedPointer<float>(recvXScales);
  o.recvTopkIdx = typedPointer<int64_t>(recvTopkIdx);
  o.recvTopkWeights = typedPointer<float>(recvTopkWeights);
  o.recvSrcIdx = typedPointer<int32_t>(recvSrcIdx);
  o.numRecvTokensPerExpert = typedPointer<int32_t>(numRecvTokensPerExpert);
  o.numRecvTokens = typedPointer<int32_t>(numRecvTokens);
  return o;
}
}  // namespace

void bindEp(py::module_& m) {
  py::module_ ep = m.def_submodule("ep", "gdx::ep (MoE dispatch/combine: normal and low-latency modes)");
  m.def("ep_available", [] { return true; });
  ep.attr("MAX_RANKS") = ep::kMaxRanks;
  ep.attr("MAX_EXPERTS") = ep::kMaxExperts;
  ep.attr("MAX_TOPK") = ep::kMaxTopk;
  ep.attr("FP8_SCALE_BLOCK") = ep::kFp8ScaleBlock;
  py::enum_<ep::DType>(ep, "DType")
      .value("bfloat16", ep::DType::kBFloat16)
      .value("float8_e4m3", ep::DType::kFloat8E4M3);

  py::class_<ep::Config>(ep, "Config")
      .def(py::init<>())
      .def_readwrite("num_sms", &ep::Config::numSms)
      .def_readwrite("num_threads", &ep::Config::numThreads)
      .def_static("for_ranks", &ep::Config::forRanks);

  // The dispatch structs also have a constructor taking every field (pointers as ints), so that the package fills
  // one in a single call instead of one attribute assignment per field (each a crossing into the extension).
  py::class_<ep::DispatchInputs> in(ep, "DispatchInputs");
  in.def(py::init(&dispatchInputsOf), py::arg("x"), py::arg("x_scales"), py::arg("num_tokens"), py::arg("hidden"),
         py::arg("dtype"), py::arg("topk_idx") = 0, py::arg("topk_weights") = 0, py::arg("num_topk") = 0,
         py::arg("num_experts") = 0, py::arg("is_token_in_rank") = 0, py::arg("num_tokens_per_expert") = 0)
      .def(py::init<>())
      .def_readwrite("num_tokens", &ep::DispatchInputs::numTokens)
      .def_readwrite("hidden", &ep::DispatchInputs::hidden)
      .def_readwrite("num_topk", &ep::DispatchInputs::numTopk)
      .def_readwrite("num_experts", &ep::DispatchInputs::numExperts)
      .def_readwrite("dtype", &ep::DispatchInputs::dtype);
  pointerField(in, "x", &ep::DispatchInputs::x);
  pointerField(in, "x_scales", &ep::DispatchInputs::xScales);
  pointerField(in, "topk_idx", &ep::DispatchInputs::topkIdx);
  pointerField(in, "topk_weights", &ep::DispatchInputs::topkWeights);
  pointerField(in, "is_token_in_rank", &ep::DispatchInputs::isTokenInRank);
  pointerField(in, "num_tokens_per_expert", &ep::DispatchInputs::numTokensPerExpert);

  py::class_<ep::DispatchOutputs> out(ep, "DispatchOutputs");
  out.def(py::init(&dispatchOutputsOf), py::arg("capacity"), py::arg("recv_x"), py::arg("recv_x_scales") = 0,
          py::arg("recv_topk_idx") = 0, py::arg("recv_topk_weights") = 0, py::arg("recv_src_idx") = 0,
          py::arg("num_recv_tokens_per_expert") = 0, py::arg("num_recv_tokens") = 0)
      .def(py::init<>())
      .def_readwrite("capacity", &ep::DispatchOutputs::capacity);
  pointerField(out, "recv_x", &ep::DispatchOutputs::recvX);
  pointerField(out, "recv_x_scales", &ep::DispatchOutputs::recvXScales);
  pointerField(out, "recv_topk_idx", &ep::DispatchOutputs::recvTopkIdx);
  pointerField(out, "recv_topk_weights", &ep::DispatchOutputs::recvTopkWeights);
  pointerField(out, "recv_src_idx", &ep::DispatchOutputs::recvSrcIdx);
  pointerField(out, "num_recv_tokens_per_expert", &ep::DispatchOutputs::numRecvTokensPerExpert);
  pointerField(out, "num_recv_tokens", &ep::DispatchOutputs::numRecvTokens);

  py::class_<ep::CombineInputs> cin(ep, "CombineInputs");
  cin.def(py::init<>());
  pointerField(cin, "x", &ep::CombineInputs::x);
  pointerField(cin, "topk_weights", &ep::CombineInputs::topkWeights);
  pointerField(cin, "bias0", &ep::CombineInputs::bias0);
  pointerField(cin, "bias1", &ep::CombineInputs::bias1);

  py::class_<ep::CombineOutputs> cout(ep, "CombineOutputs");
  cout.def(py::init<>());
  pointerField(cout, "combined_x", &ep::CombineOutputs::combinedX);
  pointerField(cout, "combined_topk_weights", &ep::CombineOutputs::combinedTopkWeights);

  py::class_<ep::DispatchHandle>(ep, "DispatchHandle")
      .def_property_readonly("max_tokens", &ep::DispatchHandle::maxTokens)
      .def_property_readonly("num_tokens", &ep::DispatchHandle::numTokens)
      .def_property_readonly("hidden", &ep::DispatchHandle::hidden)
      .def_property_readonly("num_topk", &ep::DispatchHandle::numTopk)
      .def_property_readonly("num_recv_tokens", &ep::DispatchHandle::numRecvTokens)
      .def_property_readonly("address", [](const ep::DispatchHandle& h) { return addressOf(&h); });

  // The Buffer keeps the _Context it was made from alive (keep_alive), since it holds a reference to it.
  py::class_<ep::Buffer>(ep, "Buffer")
      .def(py::init([](PyContext& context, size_t nvlBytes, size_t rdmaBytes, const ep::Config& config) {
             Context& ctx = context.get();
             py::gil_scoped_release release;
             return std::make_unique<ep::Buffer>(ctx, nvlBytes, rdmaBytes, config);
           }),
           py::keep_alive<1, 2>())
      .def_property_readonly("rank", &ep::Buffer::rank)
      .def_property_readonly("num_ranks", &ep::Buffer::numRanks)
      .def_property_readonly("config", &ep::Buffer::config)
      .def("max_tokens_per_rank", &ep::Buffer::maxTokensPerRank)
      .def("new_handle", &ep::Buffer::newHandle)
      .def("get_dispatch_layout",
           [](ep::Buffer& b, uintptr_t topkIdx, int numTokens, int numTopk, int numExperts, uintptr_t perRank,
              uintptr_t perExpert, uintptr_t inRank, uintptr_t stream) {
             b.getDispatchLayout(static_cast<const int64_t*>(pointerFrom(topkIdx)), numTokens, numTopk, numExperts,
                                 static_cast<int32_t*>(pointerFrom(perRank)),
                                 static_cast<int32_t*>(pointerFrom(perExpert)), static_cast<bool*>(pointerFrom(inRank)),
                                 streamFrom(stream));
           })
      .def(
          "dispatch_prepare",
          [](ep::Buffer& b, const ep::DispatchInputs& in, ep::DispatchHandle& h, int alignment, uintptr_t stream,
             uintptr_t perExpert) {
            py::gil_scoped_release release;
            ep::DispatchCounts c =
                b.dispatchPrepare(in, h, alignment, streamFrom(stream), static_cast<int32_t*>(pointerFrom(perExpert)));
            return std::make_pair(c.numRecvTokens, c.numRecvTokensPerExpert);
          },
          py::arg("inputs"), py::arg("handle"), py::arg("expert_alignment"), py::arg("stream"),
          py::arg("num_recv_tokens_per_expert") = 0)
      .def("dispatch", [](ep::Buffer& b, const ep::DispatchInputs& in, const ep::DispatchHandle& h,
                          const ep::DispatchOutputs& o, uintptr_t stream) { b.dispatch(in, h, o, streamFrom(stream)); })
      .def("dispatch_worst",
           [](ep::Buffer& b, const ep::DispatchInputs& in, ep::DispatchHandle& h, const ep::DispatchOutputs& o,
              int numWorst, int alignment,
              uintptr_t stream) { b.dispatchWorst(in, h, o, numWorst, alignment, streamFrom(stream)); })
      .def("combine", [](ep::Buffer& b, const ep::CombineInputs& in, const ep::DispatchHandle& h,
                         const ep::CombineOutputs& o, uintptr_t stream) { b.combine(in, h, o, streamFrom(stream)); })
      // The cached dispatch and the combine with every field as an argument: one crossing per call for the two
      // calls that never wait on the host, whose host time the GPU waits for when the kernels are short.
      .def(
          "dispatch_flat",
          [](ep::Buffer& b, const ep::DispatchHandle& h, uintptr_t x, uintptr_t xScales, int numTokens, int hidden,
             ep::DType dtype, int capacity, uintptr_t recvX, uintptr_t recvXScales, uintptr_t stream) {
            b.dispatch(dispatchInputsOf(x, xScales, numTokens, hidden, dtype), h,
                       dispatchOutputsOf(capacity, recvX, recvXScales), streamFrom(stream));
          },
          py::arg("handle"), py::arg("x"), py::arg("x_scales"), py::arg("num_tokens"), py::arg("hidden"),
          py::arg("dtype"), py::arg("capacity"), py::arg("recv_x"), py::arg("recv_x_scales"), py::arg("stream"))
      .def(
          "combine_flat",
          [](ep::Buffer& b, const ep::DispatchHandle& h, uintptr_t x, uintptr_t topkWeights, uintptr_t bias0,
             uintptr_t bias1, uintptr_t combinedX, uintptr_t combinedTopkWeights, uintptr_t stream) {
            const ep::CombineInputs in{typedPointer<const void>(x), typedPointer<const float>(topkWeights),
                                       typedPointer<const void>(bias0), typedPointer<const void>(bias1)};
            const ep::CombineOutputs o{typedPointer<void>(combinedX), typedPointer<float>(combinedTopkWeights)};
            b.combine(in, h, o, streamFrom(stream));
          },
          py::arg("handle"), py::arg("x"), py::arg("topk_weights"), py::arg("bias0"), py::arg("bias1"),
          py::arg("combined_x"), py::arg("combined_topk_weights"), py::arg("stream"))
      .def("counts_matrix",
           [](const ep::Buffer& b, const ep::DispatchHandle& h) { return addressOf(b.countsMatrix(h)); })
      .def("check_errors", &ep::Buffer::checkErrors)
      .def("local_buffer",
           [](const ep::Buffer& b) { return std::make_pair(addressOf(b.localMemory()), b.localBytes()); })
      // The C++ object, for gdx._gdx_torch (a module of its own pybind11, which cannot take this class).
      .def_property_readonly("address", [](const ep::Buffer& b) { return addressOf(&b); });
  bindEpLowLatency(ep);
}

#else

void bindEp(py::module_& m) {
  m.def("ep_available", [] { return false; });  // a build without CUDA has no MoE layer
}

#endif

}  // namespace gdx::python
