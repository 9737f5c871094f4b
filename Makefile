# The two set-up commands of the README, and their parts.
#   make demo   - install, start the local stack, run the main job
#   make test   - install, start the local stack, run every test
# Each step is idempotent: a second run reuses the virtualenv and the running stack.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: venv stack test demo down lint docs clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "threes needs Python >= 3.11 (found %s); set PYTHON=python3.11" % sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -e '.[dev,mysql]'
	touch $@

stack: venv
	$(BIN)/threes local up

test: stack
	$(BIN)/pytest

demo: stack
	$(BIN)/threes demo

down:
	$(BIN)/threes local down

docs: venv
	$(BIN)/threes docs -o docs/config-reference.md

lint: venv
	$(BIN)/ruff check .

clean: down
	rm -rf $(VENV) .threes
