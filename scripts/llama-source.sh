# Sourced by build-llama-bench.sh and build-llama-cuda.sh: the one pin of
# llama.cpp (the llama-cpp-python sdist that vendors it) and of cmake, and
# `llama_source OUT [PIP_PACKAGE...]`, which puts cmake (and the packages
# named) into the private venv OUT/venv and the sdist's source under OUT,
# setting SRC to llama.cpp's folder in it.
VERSION=0.3.36      # llama-cpp-python sdist, pins llama.cpp (commit 0c1e570)
CMAKE_VERSION=3.31.6

llama_source() {
    local out=$1
    shift
    # cmake from PyPI into a private venv (no system packages touched)
    if [[ ! -x "$out/venv/bin/cmake" ]]; then
        python3 -m venv "$out/venv"
        "$out/venv/bin/pip" install --quiet "cmake==$CMAKE_VERSION" "$@"
    fi
    if [[ ! -d "$out/llama_cpp_python-$VERSION" ]]; then
        "$out/venv/bin/pip" download --quiet --no-deps --no-binary llama-cpp-python \
            --dest "$out" "llama-cpp-python==$VERSION"
        tar -xzf "$out/llama_cpp_python-$VERSION.tar.gz" -C "$out"
    fi
    SRC="$out/llama_cpp_python-$VERSION/vendor/llama.cpp"
}
