#!/bin/sh
# Prints the interpreter `make` builds .venv with (Makefile: PYTHON; `make PYTHON=... ` wins).
#
# The distribution's own Python when it is 3.11 or newer and can make a venv: distributions
# build it with profile-guided and link-time optimization and link libpython into the binary;
# a Python built from source with defaults (pyenv's, first on PATH on the development machine)
# has neither. Quanta's own work is pure Python (the server's per-token path, the scheduler,
# the simulator) and runs faster on the former (figures: bench/results/README.md, "The
# interpreter"). Otherwise: the first python3 on PATH.
for candidate in /usr/bin/python3 python3; do
    if "$candidate" -c 'import ensurepip, sys, venv; sys.exit(sys.version_info < (3, 11))' \
        2>/dev/null; then
        echo "$candidate"
        exit 0
    fi
done
echo python3
