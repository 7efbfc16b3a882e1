#!/usr/bin/env bash
# The trusted-time experiments in one command, from the repository root:
#   bash scripts/trusted_time/run.sh OUTDIR [run_experiments.py options]
# bubblewrap is not installed on the GPU machine: a carried Debian package (.debs/*.deb or .whl/*.deb) is
# unpacked with dpkg -x into a temp prefix and the project's sandbox is pointed at it (CUDAL1_BWRAP).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: bash scripts/trusted_time/run.sh OUTDIR [options]}
shift
mkdir -p "$OUT"
if [ -z "${CUDAL1_BWRAP:-}" ] && ! command -v bwrap >/dev/null 2>&1; then
  PREFIX=""
  for deb in .debs/*.deb .whl/*.deb; do
    [ -f "$deb" ] || continue
    [ -n "$PREFIX" ] || PREFIX=$(mktemp -d /tmp/tt-debs-XXXXXX)
    dpkg -x "$deb" "$PREFIX" || echo "dpkg -x failed for $deb"
  done
  if [ -n "$PREFIX" ] && [ -x "$PREFIX/usr/bin/bwrap" ]; then
    chmod 755 "$PREFIX"
    export CUDAL1_BWRAP="$PREFIX/usr/bin/bwrap"
    if [ -d "$PREFIX/usr/lib/x86_64-linux-gnu" ]; then
      export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    echo "bubblewrap from the carried package: $CUDAL1_BWRAP ($("$CUDAL1_BWRAP" --version 2>&1))"
  else
    echo "no bubblewrap (no .debs/*.deb or .whl/*.deb carried): the sandboxed parts fall back or fail"
  fi
fi
# nvcc, cuobjdump and nvdisasm where the toolkit keeps them, if they are not on PATH already
for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do
  if [ -d "$d" ]; then PATH="$PATH:$d"; fi
done
export PATH
export PYTHONPATH="$PWD/src:$PWD/scripts/trusted_time${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" scripts/trusted_time/run_experiments.py "$OUT" "$@"
