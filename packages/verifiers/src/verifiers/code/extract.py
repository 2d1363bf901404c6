"""Program extraction from a completion: the last fenced code block (INTELLECT-2's rule)."""

from __future__ import annotations

import re

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(
    completion: str, *, language: str = "python", require_think_close: bool = False
) -> str | None:
    """Body of the last fenced ``python`` (or untagged) code block after ``</think>``, or None."""
    if require_think_close:
        if "</think>" not in completion:
            return None
        completion = completion.split("</think>", 1)[1]
    blocks = [
        body for tag, body in _FENCE.findall(completion) if tag.lower() in ("", language, "py", "python3")
    ]
    return blocks[-1] if blocks else None
