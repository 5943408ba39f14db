// gdx._gdx_torch: the per-call fast path of gdx.ep for PyTorch users, built against the installed torch (as DeepEP
// and UCCL-EP build theirs). A call is one crossing into C++: the output tensors are made here (at::empty, a fraction
// of what torch's Python allocation costs) and the kernels launched on the stream given. It drives the native objects
// gdx._gdx made (passed by address: the two modules are built against different pybind11s, so they share no types),
// which the Python layer keeps alive for the call. Without it, gdx.ep takes the pointer path through gdx._gdx alone.
#include <ATen/ATen.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

#include <cstdint>
#include <string>
#include <tuple>

#include "gdx/ep/buffer.hpp"
#include "gdx/ep/low_latency.hpp"
#include "gdx/error.hpp"

namespace gdx::python_torch {
namespace {

namespace py = pybind11;

template <typename T>
T* objectAt(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}
cudaStream_t streamAt(uintptr_t stream) {
  return reinterpret_cast<cudaStream_t>(stream);
}
template <typename T>
T* pointerOf(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? static_cast<T*>(t->data_ptr()) : nullptr;
}

// DeepEP's layout of the received scales: memory [L, groups, rows], handed out as the view [L, rows, groups].
at::Tensor scalesLike(const at::Tensor& x, int64_t local, int64_t groups, int64_t rows, at::ScalarType type) {
  return at::empty({local, groups, rows}, x.options().dtype(type)).transpose(1, 2);
}

// low_latency_dispatch: (recv_x, recv_x_scales or None, recv_count). The Python layer checked the tensors.
py::tuple llDispatch(uintptr_t buffer, uintptr_t handle, const at::Tensor& x, const at::Tensor& topkIdx,
                     const c10::optional<at::Tensor>& cumulativeStats, const c10::optional<at::Tensor>& waitStats,
                     bool useFp8, bool roundScale, bool useUe8m0, uintptr_t stream, uintptr_t hook) {
  ep::LowLatencyBuffer& b = *objectAt<ep::LowLatencyBuffer>(buffer);
  const ep::LowLatencyConfig& c = b.config();
  const int64_t local = b.numLocalExperts(), rows = int64_t(c.maxTokensPerRank) * b.numRanks(), hidden = c.hidden;
  at::Tensor recvX =
      at::empty({local, rows, hidden}, x.options().dtype(useFp8 ? at::ScalarType::Float8_e4m3fn : at::kBFloat16));
  c10::optional<at::Tensor> recvScales;
  if (useFp8)
    recvScales = useUe8m0 ? scalesLike(x, local, hidden / 512, rows, at::kInt)
                          : scalesLike(x, local, hidden / ep::kFp8ScaleBlock, rows, at::kFloat);
  at::Tensor recvCount = at::empty({local}, x.options().dtype(at::kInt));
  ep::LowLatencyDispatchInputs in;
  in.x = x.data_ptr();
  in.topkIdx = topkIdx.data_ptr<int64_t>();
  in.numTokens = static_cast<int>(x.size(0));
  in.numTopk = static_cast<int>(topkIdx.size(1));
  in.useFp8 = useFp8;
  in.roundScale = roundScale;
  in.useUe8m0 = useUe8m0;
  ep::LowLatencyDispatchOutputs out;
  out.recvX = recvX.data_ptr();
  out.recvXScales = recvScales.has_value() ? recvScales->data_ptr() : nullptr;
  out.recvCount = recvCount.data_ptr<int32_t>();
  out.cumulativeRecvStats = pointerOf<int32_t>(cumulativeStats);
  out.waitRecvCostStats = pointerOf<int64_t>(waitStats);
  b.lowLatencyDispatch(in, out, *objectAt<ep::LowLatencyHandle>(handle), streamAt(stream),
                       objectAt<ep::LowLatencyHook>(hook));
  return py::make_tuple(recvX, recvScales.has_value() ? py::cast(*recvScales) : py::none(), recvCount);
}

// low_latency_combine: the combined tensor (`out` when given).
at::Tensor llCombine(uintptr_t buffer, uintptr_t handle, const at::Tensor& x, const at::Tensor& topkIdx,
                     const at::Tensor& topkWeights, const c10::optional<at::Tensor>& out,
                     const c10::optional<at::Tensor>& waitStats, uintptr_t stream, uintptr_t hook) {
  ep::LowLatencyBuffer& b = *objectAt<ep::LowLatencyBuffer>(buffer);
  const ep::LowLatencyHandle& h = *objectAt<ep::LowLatencyHandle>(handle);
  at::Tensor combined = out.has_value() ? *out : at::empty({topkIdx.size(0), int64_t(b.config().hidden)}, x.options());
  ep::LowLatencyCombineInputs in;
  in.x = x.data_ptr();
  in.topkIdx = topkIdx.data_ptr<int64_t>();
  in.topkWeights = topkWeights.data_ptr<float>();
  in.waitRecvCostStats = pointerOf<int64_t>(waitStats);
  b.lowLatencyCombine(in, h, combined.data_ptr(), streamAt(stream), objectAt<ep::LowLatencyHook>(hook));
  return combined;
}

// The normal mode's cached dispatch: (recv_x, recv_x_scales or None) of `rows` rows.
py::tuple cachedDispatch(uintptr_t buffer, uintptr_t handle, const at::Tensor& x,
                         const c10::optional<at::Tensor>& xScales, int64_t rows, uintptr_t stream) {
  ep::Buffer& b = *objectAt<ep::Buffer>(buffer);
  const int64_t hidden = x.size(1);
  at::Tensor recvX = at::empty({rows, hidden}, x.options());
  c10::optional<at::Tensor> recvScales;
  if (xScales.has_value()) recvScales = at::empty({rows, hidden / ep::kFp8ScaleBlock}, xScales->options());
  ep::DispatchInputs in;
  in.x = x.data_ptr();
  in.xScales = pointerOf<float>(xScales);
  in.numTokens = static_cast<int>(x.size(0));
  in.hidden = static_cast<int>(hidden);
  in.dtype = xScales.has_value() ? ep::DType::kFloat8E4M3 : ep::DType::kBFloat16;
  ep::DispatchOutputs o;
  o.recvX = recvX.data_ptr();
  o.recvXScales = pointerOf<float>(recvScales);
  o.capacity = static_cast<int>(rows);
  b.dispatch(in, *objectAt<ep::DispatchHandle>(handle), o, streamAt(stream));
  return py::make_tuple(recvX, recvScales.has_value() ? py::cast(*recvScales) : py::none());
}

// The normal mode's combine: (combined_x, combined_topk_weights or None).
py::tuple combine(uintptr_t buffer, uintptr_t handle, const at::Tensor& x, const c10::optional<at::Tensor>& topkWeights,
                  const c10::optional<at::Tensor>& bias0, const c10::optional<at::Tensor>& bias1, int64_t numTokens,
                  uintptr_t stream) {
  ep::Buffer& b = *objectAt<ep::Buffer>(buffer);
  at::Tensor combinedX = at::empty({numTokens, x.size(1)}, x.options());
  c10::optional<at::Tensor> combinedW;
  if (topkWeights.has_value()) combinedW = at::empty({numTokens, topkWeights->size(1)}, topkWeights->options());
  const ep::CombineInputs in{x.data_ptr(), pointerOf<const float>(topkWeights), pointerOf<const void>(bias0),
                             pointerOf<const void>(bias1)};
  const ep::CombineOutputs o{combinedX.data_ptr(), pointerOf<float>(combinedW)};
  b.combine(in, *objectAt<ep::DispatchHandle>(handle), o, streamAt(stream));
  return py::make_tuple(combinedX, combinedW.has_value() ? py::cast(*combinedW) : py::none());
}

}  // namespace
}  // namespace gdx::python_torch

PYBIND11_MODULE(_gdx_torch, m) {
  namespace g = gdx::python_torch;
  m.doc() = "gdx.ep's per-call fast path for PyTorch (tensors in, tensors out); see gdx/ep/_native.py";
  m.def("torch_version", [] {
    return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
           std::to_string(TORCH_VERSION_PATCH);
  });
  // A gdx::Error becomes the gdx.errors class of its code, as gdx._gdx raises it (errors.py holds the classes).
  pybind11::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const gdx::Error& e) {
      namespace py = pybind11;
      py::object byCode = py::module_::import("gdx.errors").attr("_BY_CODE");
      const std::string code = gdx::errorCodeName(e.code());
      py::object cls = byCode.attr("get")(code, py::reinterpret_borrow<py::object>(PyExc_RuntimeError));
      PyErr_SetObject(cls.ptr(), cls(py::str(e.what())).ptr());
    }
  });
  m.def("ll_dispatch", &g::llDispatch);
  m.def("ll_combine", &g::llCombine);
  m.def("cached_dispatch", &g::cachedDispatch);
  m.def("combine", &g::combine);
}
