#!/usr/bin/env bash
# System packages tether's set-up installs when they are missing: bubblewrap (the sandbox for model-written code,
# tether/rewards/sandbox.py) and Chromium (the report's browser test). Installed with apt-get when run as root on
# Debian; anywhere else a note says what is missing (the sandbox then refuses to run model-written code unless
# its weak mode is named, and the tests that need these skip).
set -u
need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq "${need[@]}" >/dev/null; }
else
    echo "note: ${need[*]} not installed (this needs root and apt-get); see docs/rewards.md (sandbox)" >&2
fi
exit 0
