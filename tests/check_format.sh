#!/usr/bin/env bash
# Every C++/CUDA source of the repository is as `make format` (clang-format, .clang-format) leaves it, which also
# keeps lines within its 120 columns. Skips (77) where clang-format or git is missing: install-deps.sh installs
# clang-format, so `make test` on a machine set up by `make` always runs it.
set -euo pipefail
cd "$1"
command -v clang-format >/dev/null || { echo "clang-format not installed: format check skipped"; exit 77; }
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "not a git checkout: format check skipped"; exit 77; }
mapfile -t files < <(git ls-files '*.hpp' '*.cpp' '*.cu' '*.cuh')
clang-format --dry-run -Werror "${files[@]}"
echo "format check: ${#files[@]} files as clang-format leaves them"
