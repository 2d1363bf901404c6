"""Completions as trainers hand them over: plain text, or a chat completion (a list of messages).

TRL's ``GRPOTrainer`` passes ``completions`` as strings for a plain-text dataset and as lists of
messages, ``[{"role": "assistant", "content": "..."}]``, for a conversational one (several
messages after tool calls). :func:`completion_text` turns either into the text a verifier reads;
:func:`verifiers.verify` applies it, so both forms can be verified directly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Message = Mapping[str, Any]
Completion = str | Message | Sequence[Message]
"""A completion: text, one chat message, or a list of chat messages."""


def _content_text(content: object) -> str:
    """A message's ``content``: a str, None, or OpenAI/Hugging Face content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise TypeError(f"message content must be a str, None or a list of parts, got {type(content).__name__}")


def message_text(messages: Completion, roles: tuple[str, ...] | None = ("assistant",)) -> str:
    """The text of ``messages`` in the given ``roles`` (all roles if None), joined by blank lines."""
    if isinstance(messages, str):
        return messages
    if isinstance(messages, Mapping):
        messages = [messages]
    if not isinstance(messages, Sequence):
        raise TypeError(
            "a completion must be a str or chat messages ({'role': ..., 'content': ...} or a list of them), "
            f"got {type(messages).__name__}"
        )
    texts = []
    for message in messages:
        if not isinstance(message, Mapping) or "content" not in message:
            raise TypeError(
                f"a chat message must be a mapping with 'role' and 'content', got {type(message).__name__}: "
                f"{str(message)[:80]}"
            )
        if roles is None or message.get("role") in roles:
            texts.append(_content_text(message["content"]))
    return "\n\n".join(text for text in texts if text)


def completion_text(completion: Completion) -> str:
    """What a verifier reads of ``completion``: a str as it is; for chat messages, the contents
    of the assistant messages in order, joined by a blank line.

    Tool results and user turns are left out (a tool's output is not the model's answer);
    content given as parts keeps its text parts. Raises ``TypeError`` for anything else.

    >>> completion_text([{"role": "assistant", "content": "The answer is 4."}])
    'The answer is 4.'
    """
    return message_text(completion, ("assistant",))
