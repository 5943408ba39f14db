"""`pip install .`: gdx's own CMake build, run from setuptools (pyproject.toml says why setuptools).

It configures the repository's CMakeLists.txt for the interpreter running pip (pybind11 and the headers come from it,
python/CMakeLists.txt says how), builds only the targets gdx and gdx_python, then `cmake --install --component python`
stages the package: the pure-Python files, the extension gdx/_gdx*.so and libgdx.so.N beside it (the extension's
RPATH is $ORIGIN, so the package is whole inside site-packages and needs no LD_LIBRARY_PATH or `make install`).

CUDA is built where nvcc is found, as `make` does. Environment:
  CMAKE_CUDA_COMPILER / CUDACXX, else nvcc on PATH, else $CUDA_HOME/bin/nvcc, else /usr/local/cuda/bin/nvcc
  GDX_CUDA=0                 build the host library only (no MoE layer, gdx.ep reports it)
  GDX_CUDA_ARCHITECTURES     e.g. 90 (CMAKE_CUDA_ARCHITECTURES and CUDAARCHS are honoured too; CMake's default: 90)
  MAX_JOBS / CMAKE_BUILD_PARALLEL_LEVEL   parallel compile jobs (default: every core)
  GDX_BUILD_TYPE             CMake build type (Release)
  GDX_CMAKE_ARGS             more -D... arguments for the configure step
  GDX_CMAKE_BUILD_DIR        an already configured build directory (`make`'s build/) to package instead of configuring
                             a new one: it is only brought up to date (CTest's pip_install test uses this)
`pip install -e .` puts the extension and libgdx into python/gdx/ (`make clean` removes them).
The CMake build directory is build/pip/cmake-<python tag> (kept between runs: a second `pip install .` recompiles
only what changed); `make clean` removes it.
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def project_version():
    m = re.search(r"project\(\s*gdx\s+VERSION\s+([0-9][0-9.]*)", (ROOT / "CMakeLists.txt").read_text())
    if not m:
        raise RuntimeError("setup.py: no project(gdx VERSION ...) in CMakeLists.txt")
    return m.group(1)


def find_nvcc():
    if os.environ.get("GDX_CUDA", "1") == "0":
        return None
    for var in ("CMAKE_CUDA_COMPILER", "CUDACXX"):
        if os.environ.get(var):
            return os.environ[var]
    candidates = [shutil.which("nvcc")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "bin", "nvcc"))
    candidates.append("/usr/local/cuda/bin/nvcc")
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def cmake():
    """The cmake of this environment (pip's, in a virtualenv that was not activated), else the one on PATH."""
    here = Path(sysconfig.get_path("scripts")) / "cmake"
    return os.environ.get("CMAKE") or (str(here) if here.exists() else "cmake")


def run(cmd, **kw):
    print("setup.py: " + " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


class CMakeBuild(build_ext):
    """Builds the one native 'extension' (the whole CMake project) and copies the staged package files."""

    def build_extension(self, ext):
        reuse = os.environ.get("GDX_CMAKE_BUILD_DIR")
        if reuse:
            build_dir = Path(reuse).resolve()
            if not (build_dir / "CMakeCache.txt").exists():
                raise RuntimeError(f"setup.py: GDX_CMAKE_BUILD_DIR={reuse} is not a configured CMake build directory")
        else:
            build_dir = ROOT / "build" / "pip" / f"cmake-{sys.implementation.cache_tag}"
            self.configure(build_dir)

        jobs = os.environ.get("MAX_JOBS")
        if not jobs and not os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL"):
            jobs = str(os.cpu_count() or 1)
        run([cmake(), "--build", build_dir, "--target", "gdx", "gdx_python"] + (["-j", jobs] if jobs else []))

        stage = Path(self.build_temp).resolve() / "cmake-install"
        shutil.rmtree(stage, ignore_errors=True)
        run([cmake(), "--install", build_dir, "--component", "python", "--prefix", stage])
        exts = list(stage.rglob("gdx/_gdx.*.so"))  # gdx._gdx (its torch extension, gdx/_gdx_torch*.so, may be beside)
        if len(exts) != 1:
            raise RuntimeError(f"setup.py: the build staged {len(exts)} extensions gdx/_gdx.*.so under {stage}; "
                               "was the Python extension skipped (see the configure output)?")
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        if not exts[0].name.endswith(suffix):
            raise RuntimeError(f"setup.py: {exts[0].name} was built for another Python than this one ({suffix}): "
                               f"{build_dir} is configured for another interpreter")
        self.copy_native(exts[0].parent, Path(self.get_ext_fullpath(ext.name)).parent)

    def configure(self, build_dir):
        args = [
            "-DCMAKE_BUILD_TYPE=" + os.environ.get("GDX_BUILD_TYPE", "Release"),
            "-DPython3_EXECUTABLE=" + sys.executable,
            "-DGDX_PYTHON_REQUIRED=ON",
            "-DBUILD_TESTING=OFF",
            "-DGDX_BUILD_BENCHMARKS=OFF",
            "-DGDX_BUILD_EXAMPLES=OFF",
        ]
        nvcc = find_nvcc()
        # NOTFOUND (not merely absent) keeps CMake's own check_language(CUDA) from finding nvcc anyway.
        args.append("-DCMAKE_CUDA_COMPILER=" + (nvcc or "NOTFOUND"))
        archs = os.environ.get("GDX_CUDA_ARCHITECTURES") or os.environ.get("CMAKE_CUDA_ARCHITECTURES")
        if nvcc and archs:
            args.append("-DCMAKE_CUDA_ARCHITECTURES=" + archs)
        args += os.environ.get("GDX_CMAKE_ARGS", "").split()
        build_dir.mkdir(parents=True, exist_ok=True)
        run([cmake(), "-S", ROOT, "-B", build_dir] + args)

    def copy_native(self, staged, dest):
        """The extension and libgdx: a symlink (libgdx.so.0 -> libgdx.so.0.1.0) becomes the file it names, under the
        link's name (the SONAME the extension asks for); the file it named is not copied twice. The .py files are
        build_py's."""
        dest.mkdir(parents=True, exist_ok=True)
        files = [p for p in staged.iterdir() if p.name.endswith(".so") or ".so." in p.name]
        linked = {p.resolve() for p in files if p.is_symlink()}
        self.gdx_native = []
        for p in files:
            if p.is_symlink() or p.resolve() not in linked:
                shutil.copyfile(p.resolve(), dest / p.name)
                self.gdx_native.append(dest / p.name)
                print(f"setup.py: {dest / p.name}", flush=True)

    def copy_extensions_to_source(self):
        """`pip install -e .`: setuptools copies the extension into python/gdx/; libgdx has to go beside it too."""
        super().copy_extensions_to_source()
        package_dir = Path(self.get_finalized_command("build_py").get_package_dir("gdx")).resolve()
        for p in getattr(self, "gdx_native", []):
            if p.parent.resolve() != package_dir:
                shutil.copyfile(p, package_dir / p.name)


setup(
    version=project_version(),
    package_dir={"": "python"},
    packages=find_packages("python", include=["gdx", "gdx.*"]),
    package_data={"gdx": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("gdx._gdx", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    # setuptools' own build/ would land in the Makefile's CMake build directory: keep it in a folder of its own there.
    options={"build": {"build_base": "build/pip"}},
    zip_safe=False,
)
