#!/bin/sh
# Stands in for the Python interpreter of scripts/train/*.sh in tests: prints the arguments, one per line.
printf "%s\n" "$@"
