#!/usr/bin/env bash
# Placeholder until the sandbox lands: nothing to install yet.
exit 0
