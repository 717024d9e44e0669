"""Keyless conversations for the tests of every host: several agents behind one long system prompt."""
from __future__ import annotations


def shared_prompt_conversations(real_texts, n: int = 3, turns: int = 4, system_chars: int = 50_000,
                                turn_chars: int = 10_000) -> list[list[str]]:
    """``n`` conversations sharing a system prompt, each growing by a distinct turn: every render of
    conversation c extends its previous one. A turn is longer than the tail a template may rewrite
    (an eighth of the text), so the conversations diverge as conversations, not as rewritten tails."""
    src = real_texts["english"] + real_texts["code"]
    system = (src * 3)[:system_chars]
    out = []
    for c in range(n):
        text, renders = system, []
        for t in range(turns):
            start = (c * 7919 + t * 1543) % (len(src) - turn_chars)
            text += f"\n<user {c}.{t}>\n" + src[start:start + turn_chars]
            renders.append(text)
        out.append(renders)
    return out
