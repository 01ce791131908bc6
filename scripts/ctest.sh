#!/usr/bin/env bash
# Builds the native core with CMake and runs its C tests: once plainly, once under ASan+UBSan. The two runs go
# side by side (each is one long single-threaded test and short ones: two cores take both at once); each
# one's output is shown whole once it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f CMakeLists.txt ]; then echo "ctest: no CMakeLists.txt yet"; exit 0; fi
variants=(plain sanitize)
for variant in "${variants[@]}"; do
  dir=build/c-$variant
  flags=()
  [ "$variant" = sanitize ] && flags=(-DGMUX_SANITIZE=ON)
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${flags[@]}" >/dev/null
  cmake --build "$dir" -j2 >/dev/null
done
pids=()
for variant in "${variants[@]}"; do
  (cd "build/c-$variant" && ctest --output-on-failure > ctest.log 2>&1) &
  pids+=($!)
done
failed=0
for i in "${!variants[@]}"; do
  wait "${pids[$i]}" || failed=1
  cat "build/c-${variants[$i]}/ctest.log"
done
exit $failed
