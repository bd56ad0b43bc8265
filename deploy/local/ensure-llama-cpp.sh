#!/usr/bin/env bash
# Install llama-cpp-python into a virtualenv, built with fixed CMake flags (see the Makefile).
#
#   deploy/local/ensure-llama-cpp.sh PYTHON VERSION [CMAKE_ARGS]
#
# With CMAKE_ARGS, the wheel is built once per machine into
#   ${SY_WHEEL_CACHE:-~/.cache/switchyard/wheels}/llama-cpp-python-VERSION-<hash of CMAKE_ARGS>/
# (the flags themselves are written next to it, in CMAKE_ARGS), with `pip wheel
# --no-cache-dir`: pip's own wheel cache keys a built wheel by the sdist alone, so it may
# hold a build with other flags (the -march=native one) and would hand it back whatever
# CMAKE_ARGS say; it is neither read nor written here. Later runs, fresh clones and fresh
# virtualenvs install that file without building. A llama-cpp-python already in the
# virtualenv that is not this file (pip's build, other flags) is replaced. Idempotent:
# when the virtualenv already holds this wheel, it does nothing.
#
# Without CMAKE_ARGS (architectures other than x86-64): `pip install
# llama-cpp-python==VERSION`, ggml's default build.
set -euo pipefail

py=${1:?usage: ensure-llama-cpp.sh PYTHON VERSION [CMAKE_ARGS]}
version=${2:?usage: ensure-llama-cpp.sh PYTHON VERSION [CMAKE_ARGS]}
cmake_args=${3:-}
pip=("$py" -m pip --disable-pip-version-check)

if [[ -z $cmake_args ]]; then
    exec "${pip[@]}" install --quiet "llama-cpp-python==$version"
fi

cache=${SY_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard/wheels}
key=llama-cpp-python-$version-$(printf '%s' "$cmake_args" | sha256sum | cut -c1-12)
dir=$cache/$key
mkdir -p "$cache"

find_wheel() { compgen -G "$dir/llama_cpp_python-$version-*.whl" | head -n 1 || true; }

# One build at a time per key (two `make setup` at once wait for each other).
exec 9>"$cache/$key.lock"
flock 9

whl=$(find_wheel)
if [[ -z $whl ]]; then
    echo "building llama-cpp-python $version (once per machine, a few minutes) into $dir"
    echo "  CMAKE_ARGS=$cmake_args"
    tmp=$(mktemp -d "$cache/.$key.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    # The sdist may come from pip's HTTP cache (it is the same file whatever the flags);
    # the build must not come from its wheel cache.
    "${pip[@]}" download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$version" -d "$tmp/sdist"
    CMAKE_ARGS=$cmake_args "${pip[@]}" wheel --quiet --no-cache-dir --no-deps \
        -w "$tmp/wheel" "$tmp"/sdist/llama_cpp_python-"$version".tar.gz
    printf '%s\n' "$cmake_args" >"$tmp/wheel/CMAKE_ARGS"
    mv "$tmp/wheel" "$dir"  # whole or not at all: an interrupted build leaves no wheel here
    whl=$(find_wheel)
    [[ -n $whl ]] || { echo "ensure-llama-cpp: no wheel in $dir after the build" >&2; exit 1; }
fi

# Is the installed llama-cpp-python this very file? pip records where it came from.
installed_from_here() {
    "$py" - "$whl" <<'EOF'
import importlib.metadata as md, json, os, sys, urllib.parse, urllib.request
try:
    text = md.distribution("llama-cpp-python").read_text("direct_url.json") or "{}"
except md.PackageNotFoundError:
    sys.exit(1)
url = urllib.parse.urlsplit(json.loads(text).get("url", ""))
here = url.scheme == "file" and os.path.realpath(urllib.request.url2pathname(url.path))
sys.exit(0 if here == os.path.realpath(sys.argv[1]) else 1)
EOF
}

if installed_from_here; then
    exit 0
fi
echo "installing $whl"
# --force-reinstall: the same version built otherwise counts as satisfied for pip.
"${pip[@]}" install --quiet --force-reinstall --no-deps "$whl"
"${pip[@]}" install --quiet "$whl"  # its dependencies (numpy, jinja2, diskcache, ...)
installed_from_here || { echo "ensure-llama-cpp: $whl did not install" >&2; exit 1; }
# The point of the flags: ggml's AMX backend must not be in this build.
"$py" -c 'import llama_cpp, sys
info = llama_cpp.llama_print_system_info().decode()
sys.exit("ensure-llama-cpp: AMX in this build: " + info if "AMX" in info else 0)'
