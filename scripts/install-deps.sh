#!/usr/bin/env bash
# Installs arpo's system dependencies on Debian/Ubuntu, skipping what is
# present: compilers and cmake for the native addon, libtorch (CPU) for the
# policy model, the Gloo headers for its c10d data parallelism, python3 with
# numpy and sympy for the sandboxed interpreter,
# Chromium for the report's browser test, and OpenBLAS (Debian's libtorch
# otherwise runs its matrix products on the reference BLAS, ~10x slower).
# Run as root (or with sudo).
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config libtorch-dev libgloo-dev libopenblas0-pthread python3 python3-numpy python3-sympy chromium)
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "[arpo] system dependencies already installed"
  exit 0
fi
echo "[arpo] installing: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "[arpo] system dependencies installed"
