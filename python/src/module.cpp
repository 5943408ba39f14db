// gdx._gdx: the extension module under the pure-Python package gdx (python/gdx/__init__.py imports it).
#include <pybind11/pybind11.h>

#include "gdx/config.hpp"
#include "python/src/bindings.hpp"

#ifndef GDX_VERSION
#define GDX_VERSION "unknown"
#endif

PYBIND11_MODULE(_gdx, m) {
  namespace gp = gdx::python;
  m.doc() = "gdx native bindings: raw pointers, sizes and streams; use the gdx package, not this module";
  m.attr("__version__") = GDX_VERSION;
  m.def(
      "default_timeout_ms", [] { return gdx::defaultTimeoutNs() / 1000000ull; },
      "The bound of every wait: GDX_TIMEOUT_MS, else 30000.");
  gp::bindErrors(m);
  gp::bindHostApi(m);
  gp::bindEp(m);
  gp::bindP2p(m);
}
