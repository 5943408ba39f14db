// gdx._gdx_torch: the per-call fast path of gdx.ep for PyTorch users, built against the installed torch (as DeepEP
// and UCCL-EP build theirs). A call is one crossing into C++: the output tensors are made here (at::empty, a fraction
// of what torch's Python allocation costs) and the kernels launched on the stream given. It drives the native objects
// gdx._gdx made (passed by address: the two modules are built against different pybind11s, so they share no types),
// which the Python layer keeps alive for the call. Without it, gdx.ep takes the pointer path through gdx._gdx alone.
// The low-latency calls check their tensors here and launch on torch's current stream: no tensor is touched from
// Python on their way (each access there costs microseconds under a torch function mode such as set_default_device).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
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
template <typename T>
T* pointerOf(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? static_cast<T*>(t->data_ptr()) : nullptr;
}

// DeepEP's layout of the received scales: memory [L, groups, rows], handed out as the view [L, rows, groups].
at::Tensor scalesLike(const at::Tensor& x, int64_t local, int64_t groups, int64_t rows, at::ScalarType type) {
  return at::empty({local, groups, rows}, x.options().dtype(type)).transpose(1, 2);
}

[[noreturn]] void invalid(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "gdx.ep: " + what);
}

// torch's Python name of a dtype, as the pointer path's messages say it.
std::string dtypeName(at::ScalarType type) {
  switch (type) {
    case at::kBFloat16: return "torch.bfloat16";
    case at::kFloat: return "torch.float32";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kBool: return "torch.bool";
    case at::ScalarType::Float8_e4m3fn: return "torch.float8_e4m3fn";
    default: return std::string("torch.") + c10::toString(type);
  }
}

std::string shapeOf(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "] " + dtypeName(t.scalar_type()) + (t.is_cuda() ? " on CUDA" : " on the CPU");
}

// `t` as a contiguous CUDA tensor of `type` with `dims` dimensions (a contiguous copy if it is not), or
// kInvalidArgument naming `what`. The checks are made here, not in Python: under a torch function mode (DeepEP's
// tests set torch.set_default_device) every tensor access from Python costs microseconds.
at::Tensor checked(const at::Tensor& t, at::ScalarType type, int64_t dims, const char* what) {
  if (t.scalar_type() != type || t.dim() != dims || !t.is_cuda())
    invalid(std::string(what) + ": expected a " + std::to_string(dims) + "-d CUDA " + dtypeName(type) +
            " tensor, got " + shapeOf(t));
  return t.contiguous();
}

template <typename T>
T* statsPointer(const c10::optional<at::Tensor>& t, at::ScalarType type, int64_t length, const char* what) {
  if (!t.has_value()) return nullptr;
  if (t->scalar_type() != type || t->dim() != 1 || t->size(0) != length || !t->is_cuda() || !t->is_contiguous())
    invalid(std::string(what) + " must be a contiguous CUDA " + dtypeName(type) + " tensor of [" +
            std::to_string(length) + "], got " + shapeOf(*t));
  return static_cast<T*>(t->data_ptr());
}

// An optional output as Python returns it: the tensor, or None.
py::object orNone(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? py::cast(*t) : py::none();
}

cudaStream_t currentStream(const at::Tensor& on) {
  return c10::cuda::getCurrentCUDAStream(on.device().index()).stream();
}

// low_latency_dispatch on the current stream: (recv_x, recv_x_scales or None, recv_count), or None when x's hidden
// size, top-k or the call's T / experts are not this buffer's (the Python layer then finds or makes that buffer).
py::object llDispatch(uintptr_t buffer, uintptr_t handle, const at::Tensor& xIn, const at::Tensor& topkIn,
                      int64_t maxTokens, int64_t numExperts, const c10::optional<at::Tensor>& cumulativeStats,
                      const c10::optional<at::Tensor>& waitStats, bool useFp8, bool roundScale, bool useUe8m0,
                      uintptr_t hook) {
  ep::LowLatencyBuffer& b = *objectAt<ep::LowLatencyBuffer>(buffer);
  const ep::LowLatencyConfig& c = b.config();
  if (xIn.dim() != 2 || topkIn.dim() != 2 || xIn.size(1) != c.hidden || topkIn.size(1) != c.maxTopk ||
      maxTokens != c.maxTokensPerRank || numExperts != c.numExperts)
    return py::none();
  const at::Tensor x = checked(xIn, at::kBFloat16, 2, "x");
  const at::Tensor topkIdx = checked(topkIn, at::kLong, 2, "topk_idx");
  if (topkIdx.size(0) != x.size(0))
    invalid("low_latency_dispatch: topk_idx has " + std::to_string(topkIdx.size(0)) + " rows, x " +
            std::to_string(x.size(0)));
  const int64_t local = b.numLocalExperts(), rows = int64_t(c.maxTokensPerRank) * b.numRanks(), hidden = c.hidden;
  ep::LowLatencyDispatchOutputs out;
  out.cumulativeRecvStats =
      statsPointer<int32_t>(cumulativeStats, at::kInt, local, "cumulative_local_expert_recv_stats");
  out.waitRecvCostStats = statsPointer<int64_t>(waitStats, at::kLong, b.numRanks(), "dispatch_wait_recv_cost_stats");
  at::Tensor recvX =
      at::empty({local, rows, hidden}, x.options().dtype(useFp8 ? at::ScalarType::Float8_e4m3fn : at::kBFloat16));
  c10::optional<at::Tensor> recvScales;
  if (useFp8)
    recvScales = useUe8m0 ? scalesLike(x, local, (hidden + 511) / 512, rows, at::kInt)
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
  out.recvX = recvX.data_ptr();
  out.recvXScales = recvScales.has_value() ? recvScales->data_ptr() : nullptr;
  out.recvCount = recvCount.data_ptr<int32_t>();
  b.lowLatencyDispatch(in, out, *objectAt<ep::LowLatencyHandle>(handle), currentStream(x),
                       objectAt<ep::LowLatencyHook>(hook));
  // x and topk_idx come back too: they may be contiguous copies, which must live until the kernels read them.
  return py::make_tuple(recvX, orNone(recvScales), recvCount, x, topkIdx);
}

// low_latency_combine on the current stream: (the combined tensor (`out` when given), x, topk_idx, topk_weights as
// launched).
py::tuple llCombine(uintptr_t buffer, uintptr_t handle, const at::Tensor& xIn, const at::Tensor& topkIn,
                    const at::Tensor& weightsIn, const c10::optional<at::Tensor>& out,
                    const c10::optional<at::Tensor>& waitStats, uintptr_t hook) {
  ep::LowLatencyBuffer& b = *objectAt<ep::LowLatencyBuffer>(buffer);
  const ep::LowLatencyHandle& h = *objectAt<ep::LowLatencyHandle>(handle);
  const ep::LowLatencyConfig& c = b.config();
  const at::Tensor x = checked(xIn, at::kBFloat16, 3, "x");
  const at::Tensor topkIdx = checked(topkIn, at::kLong, 2, "topk_idx");
  const at::Tensor weights = checked(weightsIn, at::kFloat, 2, "topk_weights");
  const int64_t rows = int64_t(c.maxTokensPerRank) * b.numRanks();
  if (x.size(0) != b.numLocalExperts() || x.size(1) != rows || x.size(2) != c.hidden)
    invalid("low_latency_combine: x is " + shapeOf(x) + ", the dispatch received [" +
            std::to_string(b.numLocalExperts()) + ", " + std::to_string(rows) + ", " + std::to_string(c.hidden) + "]");
  if (topkIdx.size(0) != h.numTokens() || topkIdx.size(1) != h.numTopk() || !weights.sizes().equals(topkIdx.sizes()))
    invalid("low_latency_combine: topk_idx " + shapeOf(topkIdx) + " and topk_weights " + shapeOf(weights) +
            " must both be the dispatch's [" + std::to_string(h.numTokens()) + ", " + std::to_string(h.numTopk()) +
            "]");
  at::Tensor combined;
  if (out.has_value()) {
    if (out->scalar_type() != at::kBFloat16 || out->dim() != 2 || out->size(0) != h.numTokens() ||
        out->size(1) != c.hidden || !out->is_cuda() || !out->is_contiguous())  // written in place: no copy
      invalid("low_latency_combine: out must be a contiguous CUDA bfloat16 tensor of [" +
              std::to_string(h.numTokens()) + ", " + std::to_string(c.hidden) + "], got " + shapeOf(*out) +
              (out->is_contiguous() ? "" : " (not contiguous)"));
    combined = *out;
  } else {
    combined = at::empty({int64_t(h.numTokens()), int64_t(c.hidden)}, x.options());
  }
  ep::LowLatencyCombineInputs in;
  in.x = x.data_ptr();
  in.topkIdx = topkIdx.data_ptr<int64_t>();
  in.topkWeights = weights.data_ptr<float>();
  in.waitRecvCostStats = statsPointer<int64_t>(waitStats, at::kLong, b.numRanks(), "combine_wait_recv_cost_stats");
  b.lowLatencyCombine(in, h, combined.data_ptr(), currentStream(x), objectAt<ep::LowLatencyHook>(hook));
  return py::make_tuple(combined, x, topkIdx, weights);
}

// The normal mode's cached dispatch on the current stream: (recv_x, recv_x_scales or None, x, x_scales or None as
// launched) of `rows` rows. x is BF16, or FP8 when x_scales are given (float32, one per 128 elements); both are
// checked here, as the low-latency calls' tensors are.
py::tuple cachedDispatch(uintptr_t buffer, uintptr_t handle, const at::Tensor& xIn,
                         const c10::optional<at::Tensor>& xScalesIn, int64_t rows) {
  ep::Buffer& b = *objectAt<ep::Buffer>(buffer);
  const bool fp8 = xScalesIn.has_value();
  const at::Tensor x = checked(xIn, fp8 ? at::ScalarType::Float8_e4m3fn : at::kBFloat16, 2, "x");
  const int64_t hidden = x.size(1);
  c10::optional<at::Tensor> xScales;
  if (fp8) {
    xScales = checked(*xScalesIn, at::kFloat, 2, "x_scales");
    if (xScales->size(0) != x.size(0) || xScales->size(1) != hidden / ep::kFp8ScaleBlock)
      invalid("x_scales: expected [" + std::to_string(x.size(0)) + ", " + std::to_string(hidden / ep::kFp8ScaleBlock) +
              "] (one per 128 elements of x), got " + shapeOf(*xScales));
  }
  at::Tensor recvX = at::empty({rows, hidden}, x.options());
  c10::optional<at::Tensor> recvScales;
  if (fp8) recvScales = at::empty({rows, hidden / ep::kFp8ScaleBlock}, xScales->options());
  ep::DispatchInputs in;
  in.x = x.data_ptr();
  in.xScales = pointerOf<float>(xScales);
  in.numTokens = static_cast<int>(x.size(0));
  in.hidden = static_cast<int>(hidden);
  in.dtype = fp8 ? ep::DType::kFloat8E4M3 : ep::DType::kBFloat16;
  ep::DispatchOutputs o;
  o.recvX = recvX.data_ptr();
  o.recvXScales = pointerOf<float>(recvScales);
  o.capacity = static_cast<int>(rows);
  b.dispatch(in, *objectAt<ep::DispatchHandle>(handle), o, currentStream(x));
  return py::make_tuple(recvX, orNone(recvScales), x, orNone(xScales));
}

// The normal mode's combine on the current stream: (combined_x, combined_topk_weights or None). The Python layer
// checked the tensors (x's shape against the handle's, the biases).
py::tuple combine(uintptr_t buffer, uintptr_t handle, const at::Tensor& x, const c10::optional<at::Tensor>& topkWeights,
                  const c10::optional<at::Tensor>& bias0, const c10::optional<at::Tensor>& bias1, int64_t numTokens) {
  ep::Buffer& b = *objectAt<ep::Buffer>(buffer);
  at::Tensor combinedX = at::empty({numTokens, x.size(1)}, x.options());
  c10::optional<at::Tensor> combinedW;
  if (topkWeights.has_value()) combinedW = at::empty({numTokens, topkWeights->size(1)}, topkWeights->options());
  const ep::CombineInputs in{x.data_ptr(), pointerOf<const float>(topkWeights), pointerOf<const void>(bias0),
                             pointerOf<const void>(bias1)};
  const ep::CombineOutputs o{combinedX.data_ptr(), pointerOf<float>(combinedW)};
  b.combine(in, *objectAt<ep::DispatchHandle>(handle), o, currentStream(x));
  return py::make_tuple(combinedX, orNone(combinedW));
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
