#!/usr/bin/env bash
# gdx's shared objects export no copy of a runtime they link: not libstdc++'s locale machinery (a toolchain that links
# libstdc++ statically would export it, and its GNU_UNIQUE facet ids then clash with the system libstdc++.so in the
# same process: a crash in the first ostringstream under Python with torch), not the CUDA runtime (one shared
# libcudart, the application's). Usage: check_exports.sh LIBRARY...
set -uo pipefail
failed=0
for lib in "$@"; do
  [ -e "$lib" ] || { echo "FAIL $lib: no such file"; failed=1; continue; }
  syms=$(nm -D --defined-only "$lib") || { echo "FAIL $lib: nm could not read it"; failed=1; continue; }
  bad=$(grep -E ' (_ZNSt6locale|_ZNSt8ios_base4Init|_ZNSt7num_put|cudaMemcpyAsync$|cudaMalloc$)' <<<"$syms" | head -5)
  if [ -n "$bad" ]; then
    echo "FAIL $(basename "$lib") exports runtime symbols it linked statically:"; echo "$bad"; failed=1
  else
    echo "ok   $(basename "$lib"): $(wc -l <<<"$syms") exported symbols, none from libstdc++ or the CUDA runtime"
  fi
done
exit $failed
