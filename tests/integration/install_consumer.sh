#!/usr/bin/env bash
# cmake --install into a temporary prefix, then build a consumer against it
# twice: with find_package(shardfeed) and with pkg-config. Both must run.
#   install_consumer.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
for f in include/shardfeed.h include/shardfeed/export.h bin/shardfeed bin/shardfeed-mock-s3; do
  [ -e "$tmp/prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
libdir=$(find "$tmp/prefix" -name 'libshardfeed.so' -printf '%h\n' | head -n1)
[ -n "$libdir" ] || { echo "FAIL: libshardfeed.so not installed"; exit 1; }

# 1. find_package
cmake -S "$src/tests/install" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
LD_LIBRARY_PATH="$libdir" "$tmp/consumer/consumer"

# 2. pkg-config
export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc -o "$tmp/consumer_pc" "$src/tests/install/consumer.c" $(pkg-config --cflags --libs shardfeed)
LD_LIBRARY_PATH="$libdir" "$tmp/consumer_pc"

# 3. the public header compiles alone as C and as C++
echo '#include <shardfeed.h>' | cc -std=c11 -Wall -Wextra -Werror -fsyntax-only -I"$tmp/prefix/include" -x c -
echo '#include <shardfeed.h>' | c++ -Wall -Wextra -Werror -fsyntax-only -I"$tmp/prefix/include" -x c++ -

# 4. the installed CLI runs
LD_LIBRARY_PATH="$libdir" "$tmp/prefix/bin/shardfeed" version

# 5. ... also without LD_LIBRARY_PATH or ldconfig (README: `cmake --install build
# --prefix /usr/local`, then `shardfeed ...`): it finds the library installed beside it
env -u LD_LIBRARY_PATH "$tmp/prefix/bin/shardfeed" version
env -u LD_LIBRARY_PATH "$tmp/prefix/bin/warm-cache" --help >/dev/null
echo "5 passed, 0 failed"
