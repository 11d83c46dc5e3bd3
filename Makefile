# The two commands a new user runs on a fresh Debian 12 machine:
#   make run    set up, build, and run the main job
#   make test   set up, build, and run every test (ctest prints "N tests passed, M failed")
BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all setup setup-test configure build run test clean

all: build

setup:
	@scripts/setup

setup-test:
	@scripts/setup --test

configure:
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS) >/dev/null

build: setup configure
	@cmake --build $(BUILD) -j $(JOBS)

run: build
	@scripts/run-default $(BUILD)

test: setup-test configure
	@cmake --build $(BUILD) -j $(JOBS)
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

clean:
	rm -rf $(BUILD)
