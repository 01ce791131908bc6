#!/usr/bin/env bash
# Builds the native core with CMake and runs its C tests: once plainly, once under ASan+UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f CMakeLists.txt ]; then echo "ctest: no CMakeLists.txt yet"; exit 0; fi
for variant in plain sanitize; do
  dir=build/c-$variant
  flags=()
  [ "$variant" = sanitize ] && flags=(-DGMUX_SANITIZE=ON)
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${flags[@]}" >/dev/null
  cmake --build "$dir" -j2 >/dev/null
  (cd "$dir" && ctest --output-on-failure)
done
