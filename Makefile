# Set-up contract: `make demo` and `make test` create .venv when missing and install the project into it.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PARITY := $(VENV)/.parity
# The editable install puts the checkout on sys.path (a .pth line) instead of setuptools' import finder:
# that finder comes after Python's own path search, so run from the folder above a clone named `turnip`
# the clone itself (a folder without __init__.py, a namespace package) won and `from turnip import
# Session` failed (tests/test_install.py).
EDITABLE := --config-settings editable_mode=compat

.PHONY: demo test install bench docs clean

$(PY):
	python3 -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(EDITABLE) -e '.[dev]'
	@command -v dot >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get install -y -q graphviz >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q graphviz >/dev/null 2>&1)) ; } || \
	  echo "note: graphviz 'dot' not found; pictures are written as .dot text (apt-get install graphviz to render)"
	@# numba compiles the compiler's sweeps once (~15 s) and caches them: pay it here, not in the first timed step
	$(PY) -m tools.warm_cache || echo "note: numba's cache was not warmed; the first compile will take about 15 s longer"
	touch $(STAMP)

# Only `make test` needs CPU torch and transformers (the parity test; about 2 minutes to install once) and
# NVVM / NVRTC (the PTX compile test).
$(PARITY): $(STAMP)
	$(PY) -m pip install -q $(EDITABLE) -e '.[parity]' || echo "note: the parity extra (CPU torch, transformers, triton) did not install; tests/test_parity_hf.py and test_attention_triton.py will skip"
	$(PY) -m pip install -q $(EDITABLE) -e '.[ptx]' || echo "note: the ptx extra (NVVM, NVRTC) did not install; tests/test_cuda_ptx.py will skip"
	touch $(PARITY)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# pytest-xdist spreads the tests over every core (`worksteal`: an idle worker takes queued tests from a busy one).
test: $(STAMP) $(PARITY)
	$(PY) -m pytest -n auto --dist worksteal

bench: $(STAMP)
	$(PY) bench/run_all.py

# The generated parts of the docs: the pass reference and the current GPU figures (tests/ check both).
docs: $(STAMP)
	$(PY) -m tools.pass_docs --write docs/passes.md
	$(PY) -m tools.bench_docs --write docs/benchmarks.md

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
