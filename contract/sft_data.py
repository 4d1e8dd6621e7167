"""The SFT training formats (contract.data's `sft`): detection and line-level validation.

- `{"prompt", "completion"}` with no `label` (that is KTO's unpaired format): each a string or
  a message list; a completion's messages are assistant turns.
- OpenAI's chat format `{"messages": [...]}` whose last message is an assistant turn: system,
  user and assistant turns, multi-turn; every assistant turn is learned unless it carries
  `"weight": 0` (OpenAI's `weight`, 0 or 1). The conversation must open with a system or user
  turn. Tool and function calling (`tools`, `functions`, `parallel_tool_calls`, `tool`/
  `function` turns, `tool_calls`/`function_call` on a message) is not supported: refused with
  the field named. A conversation has at most MAX_SFT_MESSAGES (1024) messages. `developer`
  turns are system turns (as in reinforcement lines); a content may be OpenAI's list of text
  parts (joined by newlines; other part types are refused naming the part).

A `messages` line that does not end with an assistant turn is not SFT data (it is a prompt, as
OpenAI's reinforcement format has it). Records are normalised to `{"prompt", "completion"}`
as given, or `{"messages": [{"role", "content", "weight"?}]}` (`weight` only on assistant
turns, 0 or 1); trainer.sft_data tokenises both the same way.
"""

from __future__ import annotations

from typing import Any

from contract.records import RecordError
from contract.records import each as _each
from contract.records import message_content as _content
from contract.records import text_or_messages as _text_or_messages

TOOL_KEYS = ("tools", "functions", "parallel_tool_calls")
SFT_ROLES = ("system", "user", "assistant")
NO_TOOLS = "tool and function calling is not supported for fine-tuning here: remove it"
# Turns per conversation: tokenizing renders the chat template once per assistant turn over
# the turns before it (trainer.sft_data stops where max_length is full, but turns of weight 0
# are rendered all the same), so the cost grows with the square of the turns.
MAX_SFT_MESSAGES = 1024


def is_sft(obj: dict) -> bool:
    """An SFT line: prompt + completion without a label, or messages ending with an assistant
    turn."""
    if "prompt" in obj and "completion" in obj and "label" not in obj:
        return True
    messages = obj.get("messages")
    return (
        isinstance(messages, list)
        and bool(messages)
        and isinstance(messages[-1], dict)
        and messages[-1].get("role") == "assistant"
    )


def parse_sft(obj: dict) -> dict:
    if "messages" not in obj:
        return _prompt_completion(obj)
    for key in TOOL_KEYS:
        if key in obj:
            raise RecordError(key, NO_TOOLS)
    messages = obj["messages"]
    if not isinstance(messages, list) or not messages:
        raise RecordError("messages", "must be a non-empty list of messages")
    _few_enough(messages, "messages")
    checks = [lambda m=m, i=i: _turn(m, f"messages[{i}]") for i, m in enumerate(messages)]
    turns = _each(*checks)
    if turns[0]["role"] == "assistant":
        raise RecordError("messages[0].role", "a conversation opens with a system or user turn")
    if not any(t["role"] == "assistant" and t.get("weight", 1) for t in turns):
        raise RecordError("messages", "every assistant turn has weight 0: nothing to learn")
    return {"messages": turns}


def _few_enough(messages: list, where: str) -> None:
    if len(messages) > MAX_SFT_MESSAGES:
        raise RecordError(
            where,
            f"{len(messages)} messages: at most {MAX_SFT_MESSAGES} per conversation (split it; "
            "turns past the job's max_length are cut anyway)",
        )


def _turn(msg: Any, where: str) -> dict:
    if not isinstance(msg, dict):
        raise RecordError(where, "must be an object with 'role' and 'content'")
    for key in ("tool_calls", "function_call"):
        if key in msg:
            raise RecordError(f"{where}.{key}", NO_TOOLS)
    role = msg.get("role")
    if role == "developer":  # OpenAI's newer name for system instructions (as RFT reads it)
        role = "system"
    if role in ("tool", "function"):
        raise RecordError(f"{where}.role", f"{role!r} turns: {NO_TOOLS}")
    if role not in SFT_ROLES:
        raise RecordError(f"{where}.role", f"must be one of {', '.join(SFT_ROLES)}")
    out = {"role": role, "content": _content(msg.get("content"), f"{where}.content")}
    if "weight" in msg:
        if role != "assistant":
            raise RecordError(f"{where}.weight", "only assistant turns carry a weight")
        if msg["weight"] not in (0, 1) or isinstance(msg["weight"], bool):
            raise RecordError(f"{where}.weight", "must be 0 or 1")
        out["weight"] = int(msg["weight"])
    return out


def _prompt_completion(obj: dict) -> dict:
    for key in ("prompt", "completion"):
        if isinstance(obj.get(key), list):
            _few_enough(obj[key], key)
    prompt, completion = _each(
        lambda: _text_or_messages(obj.get("prompt"), "prompt"),
        lambda: _text_or_messages(obj.get("completion"), "completion"),
    )
    if isinstance(completion, list):
        for i, m in enumerate(completion):
            if m["role"] != "assistant":
                raise RecordError(f"completion[{i}].role", "a completion holds assistant turns")
    return {"prompt": prompt, "completion": completion}


__all__ = ["is_sft", "parse_sft"]
