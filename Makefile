# One entry point per job. Every target installs what it needs into .venv itself.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
VARIANT ?= original
BACKEND ?=
EXECUTOR ?=
PORT ?= 8091
DEVICE ?= cpu
A ?= original
B ?= fixed
ROUNDS ?=
AA_ROUNDS ?=
SCENARIO ?=
SIM_CONFIG ?= configs/sim/default.yaml
EXPERIMENT ?=
SIMULATE ?=
DESIGN ?=
STARTS ?=
PAIRS ?=
SETTLE_S ?=
SEED ?=
UNTIL ?=
MAX_ROUNDS ?=
MIN_ROUNDS ?=
PILOT ?=
PLAN_FROM ?=
TARGET_HALFWIDTH_PCT ?=
SIM_SET ?=
B_SIM_SET ?=
QUICK ?=
RESUME ?=
DRY_RUN ?=
OUT ?=
MARGIN_PCT ?=
CONFIDENCE ?=
PRIMARY_METRIC ?=
TEST_JOBS ?= 2

.PHONY: help venv test test-fast lint micro serve preflight load ab demo report test-engine test-real test-real-030 test-upstream bench-sim sim-vs-real bench-load soak faults-table gpu-check gpu-wheels clean

help:
	@echo "first time: make demo (an A/B on the simulator), then make test; both build .venv first"
	@echo "make venv      .venv with the pinned packages (Python >= 3.10); no activation needed: .venv/bin/python -m ..., make <target>"
	@echo "make demo      short A/B (original vs fixed) on the simulator; prints the report path. One server start (swap"
	@echo "               design): its verdicts read 'faster in this server start', a claim about that start"
	@echo "make test      ruff and every test (installs prometheus, chromium, espeak-ng when missing: needs root)"
	@echo "make test-fast the unit tier: no processes, no servers, on both cores (TEST_JOBS=1 for one)"
	@echo "make lint      ruff over the repository"
	@echo "make serve     VARIANT=original|fixed|vectorized [BACKEND=sim|vllm|vllm-cpu] [PORT=8091] [DRY_RUN=1]"
	@echo "               [VLLM_OMNI=0.30.0 with BACKEND=vllm-cpu]"
	@echo "make load      the smoke scenario through Locust against a running server (HOST=http://127.0.0.1:8091)"
	@echo "               [VARIANT=v: a check against the variant the server reports]"
	@echo "make preflight [BACKEND=vllm|sim|vllm-cpu] [VARIANT=v[,v]] [EXPERIMENT=file] [PREPARE=1] [DRY_RUN=1]  first on a new host"
	@echo "make ab        A=original B=fixed | EXPERIMENT=configs/experiments/<x>.yaml [SIMULATE=1] [DRY_RUN=1]"
	@echo "               BACKEND=sim|vllm|vllm-cpu DESIGN=fresh|swap|nested [STARTS=S PAIRS=W] ROUNDS=3 AA_ROUNDS=1 SEED=..."
	@echo "               [UNTIL=decided MAX_ROUNDS=N MIN_ROUNDS=M] [PILOT=1 [TARGET_HALFWIDTH_PCT=1]] [PLAN_FROM=reports/<pilot>]"
	@echo "               [MARGIN_PCT=1 CONFIDENCE=0.95 PRIMARY_METRIC=...] (pre-registered analysis, in the manifest) [OUT=reports]"
	@echo "               SCENARIO=... [SIM_SET='k=v ...'] [B_SIM_SET='model.extra_step_pct=1' (known answer)] [B_HOST_DELAY_US=us]"
	@echo "               [SETTLE_S=s] [RESUME=reports/<run>] [EXECUTOR=uni|mp with BACKEND=vllm-cpu]"
	@echo "make report    RUN=reports/<run>: rebuild statistics and report from stored files [MARGIN_PCT=x]"
	@echo "make dashboard every run under reports/ in one page -> reports/index.html; SERVE=1 [DASHBOARD_PORT=8765]: live on 127.0.0.1"
	@echo "make micro     micro benchmark of the predictor variants [QUICK=1] [DEVICE=cuda]"
	@echo "make test-engine   the plugin inside the real vllm-omni 0.16.0 code predictor on CPU (own cached venv)"
	@echo "make test-real     the real vllm-omni 0.16.0 server on this machine's CPU (needs AVX-512; skipped without, saying why)"
	@echo "make test-real-030 the same server checks against the real vllm-omni 0.30.0 on the CPU"
	@echo "make test-upstream our request bodies, deploy files and CLI flags against the real vllm-omni 0.30.0 wheel"
	@echo "make bench-sim / bench-load   simulator clock vs its model / load-generator overhead (reports/bench/) [QUICK=1 for bench-sim]"
	@echo "make sim-vs-real  the simulator vs the real CPU server's stored run -> reports/bench/sim-vs-cpu.md"
	@echo "make soak / faults-table      long soak / every fault through Locust and the A/B runner (reports/bench/)"
	@echo "make gpu-check [DEVICE=cpu|cuda] [OUT=dir]  on a bare GPU machine, no network: variants, syncs, micro vs PR #1614,"
	@echo "               a short simulated A/B -> reports/gpu/<UTC>/ (docs/gpu-host.md); DEVICE=cpu: the same on the CPU"
	@echo "make gpu-wheels the wheels gpu-check installs offline (scripts/gpu-check-wheels.txt) -> .gpu-wheels/ (network)"
	@echo "make clean     remove .venv and the test caches"
	@echo "make help      this list. How long each takes: reports/bench/timings.md; every option: docs/guide.md"

$(STAMP): pyproject.toml loadtest/tts_locust_help.pth
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip==25.3
	$(PY) -m pip install -q -e '.[dev]'
	@# Locust prints --help before it reads a locustfile: this start-up hook adds the suite's options (loadtest/locust_help.py)
	cp loadtest/tts_locust_help.pth "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/"
	@touch $(STAMP)

venv: $(STAMP)

# --durations: the slowest tests in every CI log, where the 60-minute budget is spent
test: $(STAMP)
	bash scripts/system-deps.sh
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q --durations=25

# The unit tier on both cores of a 2-core box (pytest-xdist): its tests share no files, ports or processes.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n $(TEST_JOBS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

micro: $(STAMP)
	$(PY) -m tools.micro --device $(DEVICE) $(if $(QUICK),--quick,)

serve: $(STAMP)
	$(PY) -m ttssim.launch --variant $(VARIANT) --port $(PORT) --device $(DEVICE) --config $(SIM_CONFIG) \
		$(if $(BACKEND),--backend $(BACKEND),) $(if $(EXECUTOR),--executor $(EXECUTOR),) $(if $(DRY_RUN),--dry-run,)

# First command on a new host (docs/gpu-host.md): host, image, one hot-swap server, a WAV and a streamed Base request
# per variant, its sync signature on /metrics, telemetry -> reports/preflight-<UTC>/preflight.json. VARIANT only when
# given (the file's default would narrow the check to one variant); BACKEND as make serve decides it.
preflight: $(STAMP)
	$(PY) -m loadtest.preflight $(if $(BACKEND),--backend $(BACKEND),) \
		$(if $(filter command line environment,$(origin VARIANT)),--variant $(VARIANT),) \
		$(if $(EXPERIMENT),--experiment $(EXPERIMENT),) $(if $(PREPARE),--prepare,) $(if $(DRY_RUN),--dry-run,)

HOST ?= http://127.0.0.1:$(PORT)
LOAD_SCENARIO ?= configs/scenarios/smoke.yaml
# the records carry the variant the server reports on /metrics; VARIANT, when given, is a check (another one: refused)
load: $(STAMP)
	$(VENV)/bin/locust -f loadtest/tts.py --headless --host $(HOST) --scenario $(LOAD_SCENARIO) \
		$(if $(filter command line environment,$(origin VARIANT)),--variant $(VARIANT),)

bench-sim: $(STAMP)
	$(PY) -m tools.bench_sim $(if $(QUICK),--quick,)

# the simulator vs the real CPU server (stored run, fitted profile) -> reports/bench/sim-vs-cpu.md
sim-vs-real: $(STAMP)
	$(PY) -m tools.sim_vs_real

bench-load: $(STAMP)
	$(PY) -m tools.bench_load --out reports/bench/loadgen.md

soak: $(STAMP)
	$(PY) -m tools.soak

faults-table: $(STAMP)
	$(PY) -m tools.fault_table

# the shorthand (A, B, SIM_CONFIG) or an experiment file (EXPERIMENT: its arms, scenario and design defaults)
AB_WHAT = $(if $(EXPERIMENT),--experiment $(EXPERIMENT),--a $(A) --b $(B) --sim-config $(SIM_CONFIG))
ab: $(STAMP)
	$(if $(and $(UNTIL),$(filter-out decided,$(UNTIL))),$(error UNTIL=$(UNTIL): the only rule is UNTIL=decided),)
	$(PY) -m loadtest.ab $(if $(RESUME),--resume $(RESUME),$(AB_WHAT) \
		$(if $(BACKEND),--backend $(BACKEND),) $(if $(SIMULATE),--simulate,) $(if $(DESIGN),--design $(DESIGN),) \
		$(if $(STARTS),--starts $(STARTS),) $(if $(PAIRS),--window-pairs $(PAIRS),) \
		$(if $(SETTLE_S),--settle-s $(SETTLE_S),) $(if $(ROUNDS),--rounds $(ROUNDS),) \
		$(if $(AA_ROUNDS),--aa-rounds $(AA_ROUNDS),) $(if $(SEED),--seed $(SEED),) \
		$(if $(UNTIL),--until-decided,) $(if $(MAX_ROUNDS),--max-rounds $(MAX_ROUNDS),) \
		$(if $(MIN_ROUNDS),--min-rounds $(MIN_ROUNDS),) $(if $(PILOT),--pilot,) \
		$(if $(TARGET_HALFWIDTH_PCT),--target-halfwidth-pct $(TARGET_HALFWIDTH_PCT),) \
		$(if $(PLAN_FROM),--plan-from $(PLAN_FROM),) $(if $(SCENARIO),--scenario $(SCENARIO),) \
		$(if $(MARGIN_PCT),--margin-pct $(MARGIN_PCT),) $(if $(CONFIDENCE),--confidence $(CONFIDENCE),) \
		$(if $(PRIMARY_METRIC),--primary-metric $(PRIMARY_METRIC),) \
		$(foreach kv,$(SIM_SET),--sim-set $(kv)) $(foreach kv,$(B_SIM_SET),--b-sim-set $(kv)) \
		$(if $(B_HOST_DELAY_US),--b-host-delay-us $(B_HOST_DELAY_US),) $(if $(EXECUTOR),--executor $(EXECUTOR),) \
		$(if $(OUT),--out $(OUT),) $(if $(DRY_RUN),--dry-run,))

demo: $(STAMP)
	$(PY) -m loadtest.ab --demo

report: $(STAMP)
	$(if $(RUN),,$(error RUN=reports/<run> is required))
	$(PY) -m ttsreport $(RUN) $(if $(MARGIN_PCT),--margin-pct $(MARGIN_PCT),)

# every run folder under reports/ in one self-contained page; SERVE=1 serves it on 127.0.0.1 only, live while a run writes
.PHONY: dashboard
dashboard: $(STAMP)
	$(PY) -m ttsreport.dashboard reports $(if $(SERVE),--serve $(if $(DASHBOARD_PORT),--port $(DASHBOARD_PORT),),)

test-engine: $(STAMP)
	bash tests/engine/run.sh

# the real vllm-omni 0.16.0 server on this CPU (BACKEND=vllm-cpu), started once for the module; skipped with the
# reason printed when the CPU lacks AVX-512 (docs/real-cpu-server.md)
test-real: $(STAMP)
	TTS_TEST_REAL=1 $(PY) -m pytest -q -s -p no:cacheprovider --durations=12 tests/real

# vllm-omni 0.30.0, today's release, on this CPU (make serve BACKEND=vllm-cpu VLLM_OMNI=0.30.0): its own cached venv
# (about 4 GB, cpu_server/requirements-030.txt), the stock code predictor; skipped like test-real without AVX-512
test-real-030: $(STAMP)
	TTS_TEST_REAL_030=1 $(PY) -m pytest -q -s -p no:cacheprovider --durations=8 tests/real/test_real_030.py

# our request bodies, deploy files, serve flags, evidence patterns and metric names against the real vllm-omni
# 0.30.0 (and 0.16.0 / 0.32.0rc1 sources); own cached venv (docs/versions.md)
test-upstream:
	bash tests/upstream/run.sh

# A GPU machine without network or a venv (docs/gpu-host.md, "The GPU check"): the script uses the image's Python
# and installs what it lacks from .gpu-wheels/; only DEVICE=cpu (here) builds .venv first.
gpu-check: $(if $(filter cpu,$(DEVICE)),$(STAMP),)
	bash scripts/gpu-check.sh --device $(DEVICE) $(if $(OUT),--out $(OUT),)

gpu-wheels: $(STAMP)
	bash scripts/gpu-check.sh --fetch-wheels

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
