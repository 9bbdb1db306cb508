# tpuctl developer entry points. `make test` on a fresh clone installs everything it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-dev
DEMO_ROOT ?= /tmp/tpuctl-demo-$(shell id -u)
DEMO_VENV := .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed
DOCS_STAMP := $(VENV)/.installed-docs
TORCH_STAMP := $(VENV)/.installed-torch
SITE_DIR ?= site
SCHEDULES ?= 500
SEED ?=
SOAK_ROOT ?= /tmp/tpuctl-soak-$(shell id -u)

.PHONY: install install-torch bytecode test test-fast lint docs docs-serve protos check-protos prometheus demo bench bench-scale soak soak-slice clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

## Byte-compile tpuctl: an editable install never gets .pyc files when PYTHONDONTWRITEBYTECODE is set,
## and every short-lived command (barrier, status) would recompile its modules on each start.
bytecode: install
	$(PY) -m compileall -q tpuctl

## Regenerate the committed protobuf/gRPC code from protos/.
protos: install
	$(PY) tools/protos.py generate

## Fail when the committed generated code is stale against protos/.
check-protos: install
	$(PY) tools/protos.py check

## A real Prometheus server for the metrics test (tests/metrics): Debian's package, installed when missing
## where this user may (root with apt-get); elsewhere that test is skipped and says why.
prometheus:
	$(PY) tests/harness/prometheus.py

## The torch extra (torch 2.9.0 + torch_xla 2.9.0, pinned together) into the same .venv, with a stamp of its own:
## 3.9 GB to download and 4 minutes once; the torch_xla and torch.distributed tests need it (`make test`).
## Its peak is about 11 GB on the disk: the 3.9 GB of wheels sit in pip's temporary folder while 7.1 GB unpack
## (no copy in pip's cache). It checks the space first and says what it found, rather than failing half-way.
$(TORCH_STAMP): $(STAMP) pyproject.toml
	@avail=$$(df -Pk $(VENV) | awk 'NR==2 {print $$4}'); tmp=$$(df -Pk $${TMPDIR:-/tmp} | awk 'NR==2 {print $$4}'); \
	need=$$((11 * 1024 * 1024)); \
	if [ "$$avail" -lt "$$need" ] || [ "$$tmp" -lt "$$((4 * 1024 * 1024))" ]; then \
	  echo "make install-torch: the torch extra needs about 11 GB free at its peak (7.1 GB installed in $(VENV), 3.9 GB of wheels in $${TMPDIR:-/tmp} meanwhile);" >&2; \
	  echo "  free now: $$((avail / 1048576)) GB beside $(VENV), $$((tmp / 1048576)) GB in $${TMPDIR:-/tmp}. Free some space (old clones and their .venv, pip cache purge) or point TMPDIR elsewhere, then run make again." >&2; \
	  exit 1; fi
	$(PY) -m pip install -q --no-cache-dir -e '.[torch]'
	touch $(TORCH_STAMP)

install-torch: $(TORCH_STAMP)

## The fuzz tests (CPU-bound, in-process: no loopback address, port or process of their own) run beside the
## rest, one core each on a 2-core machine, then the soak's fixed-seed slice, the partition tests (marked netns:
## their hosts in network namespaces of their own) and a few long cluster tests (marked beside); their output
## follows the rest's, and any failing fails `make test`.
test: install install-torch bytecode check-protos prometheus
	@rm -f .fuzz.log; { $(PY) -m pytest -q -p no:cacheprovider -m fuzz && \
	  $(PY) -m pytest -q -p no:cacheprovider --durations=10 -m "soak or netns or beside"; } > .fuzz.log 2>&1 & fuzz=$$!; \
	TPUCTL_REQUIRE_TORCH=1 $(PY) -m pytest -q --durations=30 -m "not fuzz and not soak and not netns and not beside"; rest=$$?; \
	wait $$fuzz; fuzzed=$$?; echo "--- run beside: the fuzz tests, then the soak slice, the netns and the beside tests (pytest -m fuzz; pytest -m \"soak or netns or beside\"):"; cat .fuzz.log; \
	test $$rest -eq 0 && test $$fuzzed -eq 0

## Only the fast tests (skips multi-process clusters).
test-fast: install
	$(PY) -m pytest -q -m "not slow"

## ruff, mypy (strict) and the import contract between the layers (tests/test_layers.py, read with ast).
lint: install
	$(VENV)/bin/ruff check tpuctl tests tools bench
	$(VENV)/bin/mypy tpuctl
	$(PY) -m pytest -q -p no:cacheprovider tests/test_layers.py

## The docs extra (MkDocs, Material, mkdocs-click, mkdocstrings) into the same .venv, with a stamp of its own:
## `make test` never installs it.
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e '.[docs]'
	touch $(DOCS_STAMP)

## The documentation site (mkdocs.yml, docs/), built strictly: a warning (a broken link or reference, a page
## missing from the nav) fails it. Output in site/ (gitignored).
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir $(SITE_DIR)

## The site on http://127.0.0.1:8000, rebuilt on every edit.
docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict

## The demo needs tpuctl's runtime dependencies only (click, grpcio, protobuf, pyyaml): a light venv of its
## own, seconds to make, not the dev extra's TensorFlow / JAX / libtpu.
$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install -q -e .
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/tpuctl sim up v4-32 --root $(DEMO_ROOT)
	$(DEMO_VENV)/bin/tpuctl sim status --root $(DEMO_ROOT) || { $(DEMO_VENV)/bin/tpuctl sim down --root $(DEMO_ROOT); exit 1; }
	$(DEMO_VENV)/bin/tpuctl sim run --root $(DEMO_ROOT) --timeout 1m -- \
	  sh -c 'echo "task $$TPUCTL_TASK_ID of $$JAX_NUM_PROCESSES, mapping $$TPUCTL_MAPPING"' \
	  || { $(DEMO_VENV)/bin/tpuctl sim down --root $(DEMO_ROOT); exit 1; }
	$(DEMO_VENV)/bin/tpuctl sim down --root $(DEMO_ROOT)

## bench/run.py: first tpuctl.job.progress beside a bare socket.send (fails above 5x; target 2x), then the rest;
## bench/elastic.py: kill -9 of a host to the job running without it, policy elastic beside torchrun --nnodes=2:3;
## bench/metrics.py: a scrape of the coordinator of 10,000 hosts beside its status answer (fails above 300
## series or 50 ms).
bench: install bytecode
	$(PY) bench/run.py
	$(PY) bench/scale.py --sizes 256 --steady 10 --xla-heartbeat-timeout 10
	$(PY) bench/metrics.py --hosts 10000
	$(PY) bench/elastic.py --rounds 3

## The coordination service at pod scale beside XLA's C++ service (minutes per size; docs/development/performance.md);
## --progress: the watchdog's pace reports (service CPU against the steady phase) and a hang named to every host
## (hang_timeout 10 s; the steady and progress phases last one report interval: 100 s at 10,000 hosts).
bench-scale: install bytecode
	$(PY) bench/scale.py --sizes 256,1024,2304,4608,10000 --xla-retry-paced 64 --floor --dead-host vanish --progress --json /tmp/tpuctl-bench-scale-$(shell id -u).json

## The randomised fault soak (tools/soak; docs/development/reliability.md): SCHEDULES random schedules (500)
## of kill -9, SIGSTOP/SIGCONT, partitions (network namespaces: root), restarts, barrier timeouts and
## `tpuctl down` over an 8-host simulated cluster under restart: rejoin, every invariant checked after each.
## SEED=N starts at schedule N (SEED=N SCHEDULES=1 replays it). Report: $(SOAK_ROOT)/report.txt and .json.
## The soak's fixed-seed slice alone (tests/soak/test_slice.py; `make test` runs it beside the rest).
soak-slice: install bytecode
	$(PY) -m pytest -q -m soak tests/soak

soak: install bytecode
	$(PY) -m tools.soak --schedules $(SCHEDULES) $(if $(SEED),--seed $(SEED)) --root $(SOAK_ROOT)

clean:
	rm -rf $(VENV) $(DEMO_VENV) $(SITE_DIR) .pytest_cache .mypy_cache .ruff_cache
