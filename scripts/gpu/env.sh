#!/usr/bin/env bash
# Sourced by the device scripts: puts cuBLAS / the CUDA runtime libraries on
# LD_LIBRARY_PATH (the device image ships them inside Python wheels or
# /usr/local/cuda) and compute-sanitizer on PATH. Prints what it found.
for d in /usr/local/cuda/lib64 $(python3 - <<'PY' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
seen = set()
for r in roots:
    for p in glob.glob(os.path.join(r, "nvidia", "**", "libcublas.so*"), recursive=True):
        seen.add(os.path.dirname(p))
print(" ".join(sorted(seen)))
PY
); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer /opt/nvidia/compute-sanitizer; do
  [ -d "$d" ] && export PATH="$PATH:$d"
done
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
echo "compute-sanitizer: $(command -v compute-sanitizer || echo missing)"
