# Makefile — a thin layer over CMake. `make test` and `make demo` install what is missing
# (scripts/setup.sh), configure, build, then run the tests or the demo.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo

.PHONY: all setup build test test-cpu demo asan fuzz install clean

all: build

setup:
	@bash scripts/setup.sh

build: setup
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The main job: compile every built-in family for four archs (twice: the second run is served
# from the disk cache) and the example family from outside the library, and on a machine with a
# GPU run each op against the reference.
demo: build
	bash scripts/demo.sh $(BUILD)

# CPU tests under AddressSanitizer and UndefinedBehaviorSanitizer.
asan: setup
	cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DLAJIT_SANITIZE=ON
	cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && ctest --output-on-failure -j $(JOBS) -L cpu

# The fuzz harnesses (tests/fuzz) under libFuzzer, ASan and UBSan, FUZZ_SECONDS (15) each, in
# their own clang build; where clang has no libFuzzer it says so and passes (make test and make
# asan replay the corpora in any case).
fuzz: setup
	FUZZ_BUILD=$(abspath $(BUILD))-fuzz JOBS=$(JOBS) bash tests/fuzz/run.sh

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz
