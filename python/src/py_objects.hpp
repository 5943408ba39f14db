// The objects behind _Context and _Window, shared by the host API and the MoE bindings (an _EpBuffer is made from a
// _Context). Both are destroyed without the GIL: closing waits (bounded) for the puts still in flight.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <utility>

#include "gdx/context.hpp"
#include "gdx/error.hpp"
#include "gdx/window.hpp"

namespace gdx::python {

namespace py = pybind11;

struct PyContext {
  std::unique_ptr<Context> context;
  Context& get() const {
    if (!context) throw Error(ErrorCode::kShutdown, "this gdx.Context was closed");
    return *context;
  }
  void close() {
    std::unique_ptr<Context> c = std::move(context);
    py::gil_scoped_release release;
    c.reset();
  }
  ~PyContext() {
    if (context) close();
  }
};

struct PyWindow {
  Window window;
  void close() {
    Window w = std::move(window);
    py::gil_scoped_release release;
    w = Window();  // deregisters, after the commands already queued on it completed (bounded)
  }
  ~PyWindow() {
    if (window.valid()) close();
  }
};

}  // namespace gdx::python
