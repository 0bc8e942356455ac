#!/usr/bin/env bash
# cmake --install into a temporary prefix, then: the libraries the installed program loads are
# the ones install-deps.sh --runtime installs; the installed kiln runs its bundled checkpoint
# from PREFIX/share/kiln (also after the tree is moved), and a program built against the
# installed library, once with find_package(kiln) and once with pkg-config, writes the same
# image, pixel for pixel.
#   check_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 source=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln_install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" > "$work/install.log"
for f in bin/kiln lib/libkiln.a include/kiln/pipelines/diffusion_pipeline.h lib/cmake/kiln/kilnConfig.cmake \
         lib/pkgconfig/kiln.pc share/kiln/data/make_random/likes.json \
         share/kiln/fixtures/flux1_tiny_arch/pipeline/model_index.json; do
  [ -e "$prefix/$f" ] || { echo "not installed: $f"; exit 1; }
done

# Every shared library the installed program needs comes from a package install-deps.sh --runtime
# installs (or from libc6 / libgcc-s1, which every Debian system has).
runtime=" $(bash "$source/scripts/install-deps.sh" --print-runtime) libc6 libgcc-s1 "
for lib in $(readelf -d "$prefix/bin/kiln" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p'); do
  ok=no
  for pkg in $(dpkg -S "*/$lib" 2>/dev/null | cut -d: -f1 | tr ',' ' '); do
    case "$runtime" in *" $pkg "*) ok=yes ;; esac
  done
  [ "$ok" = yes ] || { echo "$lib: from no package of install-deps.sh --runtime ($runtime)"; exit 1; }
done

cd "$work"
"$prefix/bin/kiln" generate -o cli.png 2> cli.log
grep -qF "bundled tiny FLUX.1 checkpoint ($prefix/share/kiln/fixtures/flux1_tiny_arch/pipeline)" cli.log \
  || { echo "the installed kiln did not read its own share/kiln:"; cat cli.log; exit 1; }

cmake -S "$source/examples/generate_bundled" -B example -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" > example.log
cmake --build example >> example.log
example/generate_bundled find_package.png

PKG_CONFIG_PATH=$prefix/lib/pkgconfig
export PKG_CONFIG_PATH
# shellcheck disable=SC2046  # pkg-config's flags are words
c++ -O2 "$source/examples/generate_bundled/main.cc" $(pkg-config --cflags --libs --static kiln) -o pc_bundled
./pc_bundled pkg_config.png

"$prefix/bin/kiln" compare cli.png find_package.png --tolerance 0
"$prefix/bin/kiln" compare cli.png pkg_config.png --tolerance 0

# A moved tree still finds its files beside the program.
mv "$prefix" "$work/moved"
"$work/moved/bin/kiln" generate -o moved.png 2> moved.log
grep -qF "($work/moved/share/kiln/fixtures/flux1_tiny_arch/pipeline)" moved.log \
  || { echo "the moved kiln did not read its own share/kiln:"; cat moved.log; exit 1; }
"$work/moved/bin/kiln" compare cli.png moved.png --tolerance 0
echo "install: kiln, find_package(kiln) and pkg-config kiln give the same image"
