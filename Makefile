# `make demo`: set up from scratch and run the demos (text, image+text, video+text);
# `make test`: set up and run the linters, the docs build and every test;
# `make test-fast`: the unit tests only; `make lint`: needs only the dev tools.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# bytecode written ahead: where PYTHONDONTWRITEBYTECODE is set, every process a test starts
# would compile mixer's modules again (about 0.5 s each)
COMPILE := $(PY) -m compileall -q -j 0 mixer tests benchmarks examples

.PHONY: setup demo test test-fast fuzz lint docs docs-build bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# the CPU build of torch on local disk; any other spec downloads gigabytes
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test,lint,docs,report,ray,hf,lightning,tensorboard,video,audio]' \
		'torchdata>=0.11' 'tyro>=0.9' 'spmd_types==0.2.3'
	# the [torchtitan] extra without torchtitan's own requirements (see pyproject.toml)
	$(PY) -m pip install --quiet --no-deps 'torchtitan==0.3.0'
	# test-only: the oracle of the video tests (transformers' Qwen2VLVideoProcessor) needs
	# torchvision, whose wheel is a CUDA build: over the CPU torch its C ops do not load and
	# its `_meta_registrations` raises "operator torchvision::nms does not exist", in every
	# process that imports it (transformers' Qwen2-VL model does). A .pth file puts an empty
	# module in its place at interpreter start; nothing the processor or models call needs
	# those ops. mixer itself never imports torchvision.
	$(PY) -m pip install --quiet --no-deps torchvision==0.28.0
	cp tests/torchvision_shim.pth "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"/
	touch $(VENV)/.lint-installed $@

# the linters alone: ruff, import-linter and basedpyright, and mixer without its dependencies
# (the layer contract reads the package's files; imports the type checker cannot resolve
# without them are warnings)
$(VENV)/.lint-installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet 'ruff>=0.5' 'import-linter>=2.1' 'basedpyright>=1.20'
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

demo: setup
	$(VENV)/bin/mixer validate recipes/demo.yaml
	$(VENV)/bin/mixer inspect recipes/demo.yaml
	$(VENV)/bin/mixer preview recipes/demo.yaml -n 3 --chars 300
	$(VENV)/bin/mixer plan recipes/demo.yaml --tokens 2e6 --world 2
	mkdir -p out
	$(VENV)/bin/mixer bench recipes/demo.yaml --batches 300 --num-workers 2 --no-progress \
		--metrics-out out/metrics.jsonl --metrics-every 5
	$(VENV)/bin/mixer report out/metrics.jsonl -o out/report.png
	# image+text: generated picture captions mixed with two text sources (qwen2_vl batches)
	$(VENV)/bin/mixer validate recipes/multimodal_demo.yaml
	$(VENV)/bin/mixer inspect recipes/multimodal_demo.yaml
	$(VENV)/bin/mixer preview recipes/multimodal_demo.yaml -n 2 --chars 600 \
		--save-images out/demo-images
	$(VENV)/bin/mixer bench recipes/multimodal_demo.yaml --batches 100 --num-workers 2 \
		--no-progress
	# video+text: generated clips (mp4, webm) with the picture captions and prose
	$(VENV)/bin/mixer validate recipes/video_demo.yaml
	$(VENV)/bin/mixer inspect recipes/video_demo.yaml
	$(VENV)/bin/mixer preview recipes/video_demo.yaml -n 3 --chars 400
	$(VENV)/bin/mixer bench recipes/video_demo.yaml --batches 30 --num-workers 2 --no-progress
	# Qwen3-VL: the same clips and pictures with timestamped temporal patches
	$(VENV)/bin/mixer preview recipes/qwen3_vl_demo.yaml -n 2 --chars 400
	# audio+text: generated clips (FLAC, WAV, MP3, Vorbis, Opus) with prose (qwen2_audio batches)
	$(VENV)/bin/mixer validate recipes/audio_demo.yaml
	$(VENV)/bin/mixer inspect recipes/audio_demo.yaml
	$(VENV)/bin/mixer preview recipes/audio_demo.yaml -n 3 --chars 400
	$(VENV)/bin/mixer bench recipes/audio_demo.yaml --batches 30 --num-workers 2 --no-progress

lint: $(VENV)/.lint-installed
	$(VENV)/bin/ruff check mixer tests benchmarks examples
	$(VENV)/bin/ruff format --check mixer tests benchmarks examples
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/basedpyright

# the reference site from docs/ (mkdocs-material); broken links fail the build
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve -a 127.0.0.1:8000

docs-build: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet -d out/site

# three test processes (xdist) on two cores, since many tests wait on the subprocesses they
# start; a file each at a time, so module fixtures are built once (tests/conftest.py gives
# each one OpenMP thread). A crashed test process ends the run: xdist 3.8 replacing it under
# --dist loadfile can wait for ever (pytest-xdist#1323).
test: setup lint docs-build
	$(COMPILE)
	$(PY) -m pytest -n 3 --dist loadfile --max-worker-restart=0

# the fuzzers with many more examples than the suite runs, new ones each time
fuzz: setup
	MIXER_FUZZ_EXAMPLES=500 MIXER_FUZZ_RANDOM=1 $(PY) -m pytest -n 2 --dist loadfile \
		tests/test_fuzz_readers.py tests/test_bad_values.py tests/test_token_cache_hostile.py

# unit tests: no torchrun jobs, Ray clusters, S3 servers or slow cases
test-fast: setup
	$(COMPILE)
	$(PY) -m pytest -n 2 --dist loadfile -m "not slow and not distributed and not ray and not s3"

bench: setup
	$(PY) benchmarks/throughput.py
	$(PY) benchmarks/resume_cost.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis site out/site
