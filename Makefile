# attnscale: `make report` (the main job) and `make test` (every test) set everything up.
PYTHON    ?= /usr/bin/python3
BUILD     ?= build
REPORT    ?= report
JOBS      ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps configure build test test-cpp test-python test-install report clean install deb

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=$(PYTHON) \
	  -DATTNSCALE_REQUIRE_TORCH=ON -DATTNSCALE_REQUIRE_MPI=ON $(CMAKE_ARGS)

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The benchmark executables of bench/ (not part of `make build`) are built here too, none of them
# run, so that a change that breaks one fails `make test` rather than the next `make benchmarks`.
test-cpp: build
	cmake --build $(BUILD) -j $(JOBS) --target benchmarks
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The module's and the CLI's tests over JOBS processes (pytest-xdist; they share no files).
test-python: build
	ATTNSCALE_BIN=$(abspath $(BUILD))/bin/attnscale PYTHONPATH=$(abspath $(BUILD))/python \
	  $(PYTHON) -m pytest -q -n $(JOBS) $(wildcard tests/cli python/tests)
	ATTNSCALE_BIN=$(abspath $(BUILD))/bin/attnscale ATTNSCALE_BUILD=$(abspath $(BUILD)) \
	  $(PYTHON) -m pytest -q tests/report

# The installed copy as other projects see it (tests/install): cmake --install into a temporary
# prefix, a consumer project (find_package and pkg-config), the .deb, the wheel in a venv.
test-install: build
	ATTNSCALE_BUILD=$(abspath $(BUILD)) $(PYTHON) -m pytest -q tests/install

# The sanitized build compiles beside the release build's tests (scripts/beside.sh: its output is
# held back and printed when it ends), filling the core they leave idle; its tests run last, alone.
test: build
	@bash scripts/beside.sh build-asan/build.log '$(MAKE) --no-print-directory asan-build' \
	  '$(MAKE) --no-print-directory test-cpp test-python test-install'
	$(ASAN_CTEST)

# Installing (docs/install.md): headers, libraries, CLI, CMake package, pkg-config file and Python
# package under PREFIX; `make deb` writes build/packages/attnscale_<version>_<arch>.deb.
PREFIX ?= /usr/local
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

deb: build
	cd $(BUILD) && cpack -G DEB

report: build
	$(BUILD)/bin/attnscale report --out $(REPORT)

clean:
	rm -rf $(BUILD)

# Reliability (docs/reliability.md): the C++ suite under AddressSanitizer + UndefinedBehaviorSanitizer
# (preset "asan", -O1, build-asan/), and libFuzzer runs of FUZZ_SECONDS per target (preset "fuzz").
FUZZ_SECONDS ?= 60
SANITIZER_ENV := ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:strict_string_checks=1 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
ASAN_CTEST = cd build-asan && $(SANITIZER_ENV) ctest --output-on-failure -j $(JOBS)
.PHONY: test-asan asan-build fuzz

asan-build: deps
	cmake --preset asan >/dev/null
	cmake --build build-asan -j $(JOBS)

test-asan: asan-build
	$(ASAN_CTEST)

fuzz: deps
	cmake --preset fuzz >/dev/null
	cmake --build build-fuzz -j $(JOBS) --target npy_fuzz cli_args_fuzz attention_fuzz
	$(SANITIZER_ENV) FUZZ_SECONDS=$(FUZZ_SECONDS) bash fuzz/run.sh build-fuzz

# Benchmarks (measurements, not tests): one table of attnscale vs OpenBLAS sgemm and PyTorch.
# BENCH_ARGS=--quick for a subset; --memory adds the N = 65536 peak-RSS case. The benchmark
# executables of bench/ (build/bin/attention_bench, tile_products_bench, read_streams, ...) are not
# part of `make build`: `make benchmarks` (or `make bench`) builds them.
BENCH_ARGS ?=
.PHONY: bench benchmarks
benchmarks: build
	cmake --build $(BUILD) -j $(JOBS) --target benchmarks

bench: benchmarks
	$(PYTHON) bench/compare.py --bin $(BUILD)/bin/attnscale $(BENCH_ARGS)

# The lab's speed check: the Simulation note's numpy simulation vs `attnscale experiment saturation`.
# flash_attn_with_kvcache against attnscale.decode on FlashAttention's cache layouts (KVCACHE_ARGS).
.PHONY: bench-kvcache
bench-kvcache: build
	$(PYTHON) bench/kvcache_dropin.py --pymod $(BUILD)/python $(KVCACHE_ARGS)

.PHONY: bench-lab
bench-lab: build
	$(PYTHON) bench/saturation_vs_numpy.py --bin $(BUILD)/bin/attnscale

# Every figure of docs/distributed.md (ring attention at K = 2, transfer hidden, the many-node
# model's c, sweep speed-up at K = 2), printed as its tables; about 2 minutes on an idle machine.
.PHONY: bench-distributed
bench-distributed: benchmarks
	$(PYTHON) bench/distributed_figures.py --build $(BUILD) $(DISTRIBUTED_ARGS)

# The performance goals of docs/performance.md, each a ratio timed within one round (bench/goals.py).
.PHONY: bench-goals
bench-goals: build
	$(PYTHON) bench/goals.py --pymod $(BUILD)/python $(GOALS_ARGS)
