"""The math-verify child process: one ``[gold, candidate]`` JSON line in, ``1``/``0`` out.

Run as a script (``python -P _verify_child.py``) so it imports nothing of ours. math-verify's
own timeouts use ``signal.alarm``, which only works in a main thread, so they are disabled here
and the parent enforces the deadline instead by killing this process. An address-space limit
turns a memory blow-up (``10^{10^{10}}``) into a MemoryError rather than a host-wide OOM.
"""

import json
import logging
import resource
import sys


def main() -> None:
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    if limit > 0:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    logging.disable(logging.CRITICAL)  # "timeout disabled" warnings would flood stderr
    try:
        from math_verify import parse, verify
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises with it
        print(json.dumps({"error": f"cannot import math_verify: {exc}"}), flush=True)
        return

    def parse_any(text: str) -> list:
        """Plain text ("5 cm", "3/4", "x = 4") and inline LaTeX ("\\dfrac{3}{4}").

        Text with a LaTeX command is parsed as LaTeX first: as plain text, "5\\sqrt{2}" would
        read as its first number, 5."""
        text = text.replace("\\$", "")  # an escaped dollar is a currency sign, not math
        escaped = text.replace("\\%", "%").replace("%", "\\%")
        as_latex = lambda: parse(f"${escaped}$", parsing_timeout=None)  # noqa: E731
        if "\\" in text and "$" not in text:
            parsed = as_latex()
            if parsed:
                return parsed
        parsed = parse(text, parsing_timeout=None)
        if not parsed and "$" not in text:
            parsed = as_latex()
        return parsed

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        try:
            gold, candidate = json.loads(line)
            gold_parsed, pred_parsed = parse_any(gold), parse_any(candidate)
            ok = bool(
                gold_parsed
                and pred_parsed
                and verify(gold_parsed, pred_parsed, timeout_seconds=None)
            )
        except Exception:  # noqa: BLE001 - a malformed answer is simply wrong
            ok = False
        sys.stdout.write("1\n" if ok else "0\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
