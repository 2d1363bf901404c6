"""TOPLOC CPU benchmark (see ``toploc.bench``): batched build/verify vs the naive per-chunk loop.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/toploc_bench.py [--hidden 4096 5120] [--tokens 1024 8192 32768]

Reference toploc 0.1.6 is not run: its wheel needs torch 2.6/2.7 (it fails to import
with torch 2.13) and the CUDA torch 2.6 wheel with its nvidia-* dependencies (~3 GB).
Its numbers, measured on a comparable 2-core VM: shared/reference/toploc.md §4.4.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from toploc.bench import main

if __name__ == "__main__":
    main()
