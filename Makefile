# One entry point for maintainers, instructors and learners.  Every target puts the
# environment's bin/ first on PATH: nbgrader runs `alembic` as a subprocess when it
# creates a gradebook, and fails on a fresh course if it cannot find it.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
STAMP  := $(VENV)/.installed
UV     := uv==0.13.9
CH     ?= ch02
# `make release CH=ch02 LANG=zh`: the student version in Chinese.  Only a LANG given on make's command
# line counts (the shell's LANG is a locale such as C.UTF-8); the tools themselves keep the shell's.
EDITION := $(if $(filter command line,$(origin LANG)),$(LANG),en)
ifeq ($(filter command line,$(origin LANG)),command line)
override LANG := C.UTF-8
endif

.PHONY: help env site publish bundle test test-fast translations release autograde release-held feedback grades report collect-zip validate benchmark clean

help:
	@echo "make site        build the website into _build/html (creates .venv if missing)"
	@echo "make publish     the public tree -> public/ (site, student notebooks, utils, binder, README, licences; no answer)"
	@echo "make bundle      the instructors' bundle -> dist/ (reference, grading server, instructor notebooks, zoo, tools;"
	@echo "                 RECIPIENTS=keys.txt encrypts it to those instructors' age keys)"
	@echo "make test        run the whole maintainers' test suite (creates .venv if missing)"
	@echo "make test CH=ch05  one chapter's slice: reference, zoo, explorers, translations, fake class"
	@echo "make test-fast   the suite without the nbgrader round trip and the site build"
	@echo "make release   CH=ch02   student version -> release/CH/   (LANG=zh: the Chinese edition)"
	@echo "make autograde CH=ch02   grade every submitted/<student>/CH/ (one broken submission never stops the rest)"
	@echo "               JOBS=4    ... four submissions at once;  SHARD=2/3  ... this machine's third of the class"
	@echo "               REGRADE=1 ... also students an earlier (or interrupted) run already finished"
	@echo "make release-held CH=ch02 STUDENT=s   release the points held for review (without STUDENT: list them)"
	@echo "make feedback  CH=ch02   feedback HTML -> feedback/<student>/CH/"
	@echo "make grades              all grades -> grades.csv"
	@echo "make report    CH=ch02   what the class got wrong -> reports/CH.html and diagnoses.csv (without CH: every"
	@echo "                         graded chapter; ANONYMOUS=1: reports-anonymous/, no student named)"
	@echo "make collect-zip CH=ch02 unpack an LMS download from downloaded/CH/archive/ into submitted/"
	@echo "make validate NB=path    run your notebook as the grader will and list what passes (before submitting)"
	@echo "                         (without make, where the course's package is installed: attncourse validate path)"
	@echo "make benchmark           notebook run time and autograde time per chapter"
	@echo "make translations        refresh translations/zh/*.po after an English edit (changed paragraphs become fuzzy)"
	@echo "make benchmark CLASS=200 [CH=ch04] [JOBS=2]   a generated class graded serially and with JOBS at once"

# The environment: pinned versions, the CPU build of torch (a local wheel on these machines).
$(STAMP): requirements.txt utils/pyproject.toml solutions/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "Installing the pinned packages into $(VENV) (a few minutes the first time)..."
	@# uv installs them in a third of pip's time (31 s against 73 s here, both with empty caches), from the
	@# sources pip is configured with (tools/uv_options.py); pip does it where uv cannot be installed.
	@# Byte-compiled on every core at once (pip compiles on one: 40 of its 84 s; compileall -j 0 takes 25 s on two).
	@# Compiled here or never: where PYTHONDONTWRITEBYTECODE is set, Python writes no .pyc and every process compiles
	@# all it imports again.  A file that is not Python 3 (some packages' test data) fails here as it does under pip.
	$(BIN)/python -m pip install -qq $(UV) && $(BIN)/uv pip install -q --python $(BIN)/python \
	    $$($(BIN)/python tools/uv_options.py) -r requirements.txt \
	  || $(BIN)/python -m pip install -qq --no-compile -r requirements.txt
	-$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib >/dev/null
	$(BIN)/python -m pip install -qq --no-deps -e utils -e solutions
	@# rfc3987-syntax (jupyter-events' jsonschema[format-nongpl]) compiles a grammar whenever jsonschema is
	@# imported: 1 s of every process that reads a notebook (nbformat), hundreds in the test suite.  Nothing here
	@# validates IRIs, and jsonschema goes on without it.
	$(BIN)/python -m pip uninstall -qq -y rfc3987-syntax
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

env: $(STAMP)

# axe-core, the accessibility check the browser test runs on every page (npm's registry; pinned in tools/axe).
AXE := tools/axe/node_modules/axe-core/axe.min.js
$(AXE): tools/axe/package.json tools/axe/package-lock.json
	@if command -v npm >/dev/null; then npm ci --prefix tools/axe --no-audit --no-fund --loglevel=error && touch $@; \
	else echo "npm not found: install Node.js and npm for the browser test's accessibility check (axe-core)"; fi

site: $(STAMP)
	$(BIN)/python tools/build_site.py

# The public tree (public/): site, student notebooks, learner package, binder recipe, README, licences; no answer.
publish: site
	$(BIN)/python tools/publish.py

bundle: publish
	$(BIN)/python tools/bundle.py build $(if $(RECIPIENTS),--recipients $(RECIPIENTS))

# `make test CH=ch05`: one chapter's slice (its reference, zoo, explorers, translations and fake class); the
# site is built only by the whole suite.  Only a CH given on make's command line slices (CH defaults to ch02).
SLICE := $(if $(filter command line,$(origin CH)),-k "$(CH) and not site")

test: $(STAMP) $(AXE)
	$(BIN)/python -m pytest -n auto --dist loadgroup tests $(SLICE)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -n auto --dist loadgroup tests -m "not slow"

translations: $(STAMP)
	$(BIN)/python tools/i18n.py update
	-$(BIN)/python tools/i18n.py status | tail -1

release: $(STAMP)
	@case "$(EDITION)" in en|zh) ;; *) echo "LANG=$(EDITION): the course has the editions en and zh"; exit 2;; esac
	$(BIN)/nbgrader generate_assignment $(CH) --force
	@if [ "$(EDITION)" != en ]; then for nb in release/$(CH)/*.ipynb; do \
	  $(BIN)/python tools/i18n.py notebook "$$nb" "$$nb" --chapter $(CH) && echo "$$nb: in Chinese ($(EDITION))"; done; fi

autograde: $(STAMP)
	$(BIN)/python tools/grade_class.py $(CH) $(if $(JOBS),--jobs $(JOBS)) $(if $(SHARD),--shard $(SHARD)) $(if $(REGRADE),--regrade)

release-held: $(STAMP)
	$(BIN)/python tools/review.py $(CH) $(if $(STUDENT),--release $(STUDENT))

feedback: $(STAMP)
	$(BIN)/nbgrader generate_feedback $(CH) --force

grades: $(STAMP)
	$(BIN)/python tools/export_grades.py

report: $(STAMP)
	$(BIN)/python tools/report.py $(CH) $(if $(ANONYMOUS),--anonymous)

collect-zip: $(STAMP)
	$(BIN)/nbgrader zip_collect $(CH) --force

validate: $(STAMP)
	@test -n "$(NB)" || (echo "usage: make validate NB=path/to/notebook.ipynb"; exit 2)
	$(BIN)/python -m attncourse validate $(NB)

benchmark: $(STAMP)
	$(BIN)/python tools/benchmark.py $(if $(CLASS),--class-size $(CLASS) $(CH) $(if $(JOBS),--jobs $(JOBS)),)

clean:
	rm -rf _build release autograded feedback verdicts salvaged gradebook.db grades.csv
