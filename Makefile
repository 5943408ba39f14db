# gdx — entry point. `make` builds what this machine can build (host libraries always, CUDA code when nvcc
# is found); CMake does the work underneath (it also gives find_package(gdx) and CTest).
BUILD ?= build
BUILD_TYPE ?= Release
PREFIX ?= /usr/local
JOBS ?= $(shell nproc)
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CMAKE_FLAGS ?=
# The interpreter the Python package (python/) is built for, installed into and tested with: the first of an active
# virtualenv's or conda environment's python3 (where a PyTorch user runs `make`, the package is built for that
# environment: its pybind11 and torch are used; not conda's base, which is often active by default), Debian's
# /usr/bin/python3, and the python3 on PATH (a pyenv one, say) whose headers (Python.h) exist. Override with `make PYTHON=/path/to/python3`; on a machine without python3-dev /
# pybind11, pass carried headers with CMAKE_FLAGS='-DPython3_INCLUDE_DIR=... -DGDX_PYBIND11_INCLUDE=...' (else the
# extension is skipped, with a message). `pip install .` (setup.py) builds the same package for pip's interpreter.
PYTHON ?= $(shell for p in $${VIRTUAL_ENV:+$$VIRTUAL_ENV/bin/python3} \
  $$([ -n "$$CONDA_PREFIX" ] && [ "$${CONDA_DEFAULT_ENV:-base}" != base ] && echo $$CONDA_PREFIX/bin/python3) \
  /usr/bin/python3 $$(command -v python3); do \
  $$p -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  2>/dev/null && { echo $$p; break; }; done)
FUZZ_SECONDS ?= 600
RUN_ARGS ?= --json $(BUILD)/benchmark_local.json

.PHONY: all deps configure test test-unit test-rdma test-gpu bench bench-gpu bench-tcpx run plots install format clean fuzz

all: configure
	cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory
	@! ls $(BUILD)/python/gdx/_gdx.*.so >/dev/null 2>&1 || \
	  echo "make: the Python package is in $(BUILD)/python, for $(PYTHON): PYTHONPATH=$(BUILD)/python $(PYTHON) ..."

# The group of cmake/install-deps.sh's packages a target needs (that script lists them): `make run` only what
# benchmark_local builds and runs with (its recipe asks for it), `make` also the test and benchmark libraries and the
# Python package, the targets that run tests everything those run. Prerequisites inherit it: `make test` configures
# with every package.
DEPS = all
bench-tcpx: DEPS = build
test test-unit test-rdma test-gpu bench-gpu fuzz: DEPS = test

deps:
	@bash cmake/install-deps.sh $(DEPS)

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCMAKE_INSTALL_PREFIX=$(PREFIX) \
	  $(if $(NVCC),-DCMAKE_CUDA_COMPILER=$(NVCC)) $(if $(PYTHON),-DPython3_EXECUTABLE=$(PYTHON)) $(CMAKE_FLAGS) >/dev/null

# CTest through tests/ctest_progress.sh: a line every 30 s while a long test (the Soft-RoCE VM's) runs silently.
CTEST = $(CURDIR)/tests/ctest_progress.sh

# Every test: unit, multi-process, network namespaces, Soft-RoCE (where the machine allows each).
test: all
	cd $(BUILD) && $(CTEST) --output-on-failure --timeout 900 $(CTEST_ARGS)

test-unit: all
	cd $(BUILD) && $(CTEST) --output-on-failure -LE 'rdma|gpu' $(CTEST_ARGS)

test-rdma: all
	cd $(BUILD) && $(CTEST) --output-on-failure -L rdma $(CTEST_ARGS)

# GPU tests (skip cleanly without a GPU); run them on an H100/H200 machine whenever device code changes.
test-gpu: all
	cd $(BUILD) && NCCL_NVLS_ENABLE=0 $(CTEST) --output-on-failure -L gpu $(CTEST_ARGS)

# Every GPU benchmark with its peer of the same run (benchmarks/run_gpu_benchmarks.sh says which on 1 and on 2+ GPUs):
# tables on stdout, each benchmark's whole output and JSON in $(BUILD)/bench-gpu/.
bench-gpu: all
	bash benchmarks/run_gpu_benchmarks.sh $(BUILD) $(BUILD)/bench-gpu $(PYTHON)

# The TCPX session API's benchmark (benchmark_tcpx, 64 MiB in 512 KiB chunks over loopback) beside iperf3 (when
# installed) and benchmark_p2p in one run: tables on stdout, outputs and JSON in $(BUILD)/bench-tcpx/.
bench-tcpx: configure
	cmake --build $(BUILD) -j $(JOBS) --target benchmark_tcpx benchmark_p2p -- --no-print-directory
	bash benchmarks/run_tcpx_benchmark.sh $(BUILD) $(BUILD)/bench-tcpx

# Every fuzz target (tests/fuzz/) for FUZZ_SECONDS each, from the checked-in corpus; `make test` runs each for 10 s.
# Needs clang (install-deps.sh installs it); without it the targets are not built and this says so.
fuzz: all
	@for t in $$(cat $(BUILD)/tests/fuzz/targets.txt); do \
	  tests/fuzz/run_fuzz.sh $(BUILD)/tests/fuzz/$$t tests/fuzz/corpus/$$t $(FUZZ_SECONDS); rc=$$?; \
	  if [ $$rc = 77 ]; then echo "make fuzz: $$t skipped"; elif [ $$rc != 0 ]; then exit $$rc; fi; \
	done

bench: all
	$(BUILD)/benchmarks/bench_ring --benchmark_out=$(BUILD)/bench_ring.json --benchmark_out_format=json
	$(BUILD)/benchmarks/bench_tcp --benchmark_out=$(BUILD)/bench_tcp.json --benchmark_out_format=json
	$(BUILD)/benchmarks/bench_proxy --benchmark_out=$(BUILD)/bench_proxy.json --benchmark_out_format=json

# Builds only what it runs: the library and benchmark_local (about a minute on 2 cores), then runs it. Where nvcc is
# found but no GPU is visible (CI's machines), benchmark_local can run only its host mode: it is then built without
# CUDA, in a build directory of its own ($(BUILD)/host; a CUDA build compiles every file differently), instead of
# spending more time on device code than on the rest.
GPU_VISIBLE := $(shell (ls /dev/nvidia[0-9]* || nvidia-smi -L) >/dev/null 2>&1 && echo yes)
RUN_BUILD = $(if $(NVCC),$(if $(GPU_VISIBLE),$(BUILD),$(BUILD)/host),$(BUILD))
run:
	@$(MAKE) --no-print-directory configure DEPS=build \
	  $(if $(filter-out $(BUILD),$(RUN_BUILD)),BUILD=$(RUN_BUILD) NVCC=NOTFOUND)
	@echo "make run: building libgdx and benchmark_local in $(RUN_BUILD)" \
	  "(make builds everything, make test runs every test)"
	@cmake --build $(RUN_BUILD) -j $(JOBS) --target benchmark_local -- --no-print-directory
	@echo "make run: $(RUN_BUILD)/benchmarks/benchmark_local $(RUN_ARGS)  (--help says what it measures)"
	@$(RUN_BUILD)/benchmarks/benchmark_local $(RUN_ARGS)

# PNG and SVG plots of the benchmarks' JSON, gdx beside the peer of the same run (benchmarks/plot.py), all in the
# build tree: what the benchmarks left in $(BUILD) and $(BUILD)/bench-gpu (make run, make bench-gpu, the Soft-RoCE
# and network-namespace tests, ...) into $(BUILD)/plots, and the recorded runs of docs/data into
# $(BUILD)/plots/recorded.
# Installs python3-matplotlib when it is missing.
plots: $(BUILD)/plots/recorded/.drawn
	@bash cmake/install-deps.sh plots
	@json='$(wildcard $(BUILD)/*.json $(BUILD)/bench-gpu/*.json)'; \
	if [ -n "$$json" ]; then python3 benchmarks/plot.py --out $(BUILD)/plots $$json; \
	else echo "make plots: no benchmark JSON in $(BUILD) yet (make run, make bench-gpu, make test-rdma)"; fi
	@echo "make plots: plots of this machine's runs in $(BUILD)/plots," \
	  "of the recorded runs (docs/data) in $(BUILD)/plots/recorded"

# The recorded runs, some 280 plots: drawn again only when one of them or plot.py changed.
$(BUILD)/plots/recorded/.drawn: $(wildcard docs/data/*.json) benchmarks/plot.py
	@bash cmake/install-deps.sh plots
	@echo "make plots: drawing the recorded runs of docs/data (a minute)"
	@mkdir -p $(@D) && python3 benchmarks/plot.py --out $(@D) $(filter %.json,$^) >$(@D)/plot.log 2>&1 || \
	  { cat $(@D)/plot.log; exit 1; }
	@touch $@

install: all
	cmake --install $(BUILD)

format:
	clang-format -i $$(git ls-files '*.hpp' '*.cpp' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD) python/gdx.egg-info python/gdx/*.so*  # the last two: pip install (-e) .
