// gdx::Error -> Python. The exception classes are Python classes (gdx/errors.py: gdx.Error and one subclass per
// ErrorCode, some also deriving from the matching builtin, e.g. gdx.TimeoutError from TimeoutError); the package
// hands them over once at import, so the C++ side only picks the class by code and keeps the message as it is.
#include <pybind11/pybind11.h>

#include <exception>

#include "gdx/error.hpp"
#include "python/src/bindings.hpp"

namespace gdx::python {
namespace {

// code name -> class; a leaked reference, so it outlives the module at interpreter exit.
PyObject* gErrorClasses = nullptr;

py::object classFor(ErrorCode code) {
  if (gErrorClasses) {
    PyObject* cls = PyDict_GetItemString(gErrorClasses, errorCodeName(code));  // borrowed
    if (cls) return py::reinterpret_borrow<py::object>(cls);
  }
  return py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
}

}  // namespace

void bindErrors(py::module_& m) {
  m.def(
      "_set_error_classes",
      [](py::dict classes) {
        Py_XDECREF(gErrorClasses);
        gErrorClasses = classes.release().ptr();
      },
      "Registers {code name: exception class}; called once by gdx/errors.py.");
  py::list names;
  for (int c = static_cast<int>(ErrorCode::kOk); c <= static_cast<int>(ErrorCode::kShutdown); ++c)
    names.append(errorCodeName(static_cast<ErrorCode>(c)));
  m.attr("ERROR_CODE_NAMES") = names;
  // Raises from pybind11's own error handling: called with the GIL held.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object cls = classFor(e.code());
      py::object exc = cls(py::str(e.what()));
      try {
        exc.attr("code") = py::str(errorCodeName(e.code()));
      } catch (const py::error_already_set&) {
        // A builtin class without a __dict__ (the fallback): the message still says the code.
      }
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });
}

}  // namespace gdx::python
