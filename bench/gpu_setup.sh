#!/usr/bin/env bash
# Set up a GPU machine of the device tool the same way on every call.
#
# Here (a machine with PyPI):   bash bench/gpu_setup.sh fetch     # pure-Python wheels the GPU image lacks, into .whl/
# There (no network):           source bench/gpu_setup.sh          # installs .whl/ into /tmp/site, sets PYTHONPATH
#
# The GPU image has torch, CuPy, numba-cuda, numpy, networkx, pytest and hypothesis, but not xdsl (and its
# immutabledict and ordered-set), graphviz or ml_dtypes (bfloat16 host arrays; a binary wheel, fetched for
# CPython 3.12 on manylinux x86_64). The call must carry .whl (it is git-ignored).
WHEELS="xdsl==0.74.0 immutabledict==4.3.1 ordered-set==4.1.0 graphviz==0.21 ml_dtypes==0.5.4"
if [ "${1:-}" = "fetch" ]; then
    mkdir -p .whl
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .whl $WHEELS
    ls .whl
else
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
    # bytecode is written and kept, as on a user's machine (pip compiles what it installs; the rest is
    # compiled at its first import): otherwise every fresh process compiles its imports again (about 2 s
    # of a cold `turnip llama`, measured with cProfile on this image)
    echo "PYTHONDONTWRITEBYTECODE was '${PYTHONDONTWRITEBYTECODE:-}'"
    unset PYTHONDONTWRITEBYTECODE
    export PYTHONPATH="/tmp/site:$PWD"
    export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1
fi
