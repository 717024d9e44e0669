"""One vLLM API process, as ``vllm serve`` starts it, serving chats through vLLM's own chat front end
(``bench/peers/vllm_front.py``) in the tokenizer mode it picks; run twice by the vLLM tier, with and
without ``DELTA_RAY_VLLM=1``, to show that the switch changes no prompt ID and no renderer choice.

    python tests/tools/vllm_switch_check.py SPEC.json OUT.json

SPEC: ``{"models": [{"name", "folder", "mode"}], "chats": [[messages of turn 0], [... turn 1], ...]}``.
OUT: per model, the renderer's class, vLLM's choice of mode, whether its tokenizer encodes through
delta-ray, whether the renderer's pools carry the request scope, the prompt IDs of every turn, and
the drop-in's count of continued conversations.
"""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _serve(model: dict, chats: list) -> dict:
    from vllm.tokenizers.registry import tokenizer_args_from_config

    from bench.peers.vllm_front import FrontEnd
    from delta_ray.apps.dropin.binding import is_carrying
    from delta_ray.apps.dropin.hf import STATE_ATTR
    from delta_ray.apps.dropin.vllm_scope import POOLS

    front = FrontEnd(model["folder"], model.get("mode", "auto"), max_model_len=1 << 20)
    renderer = front.renderer
    tokenizer = renderer.tokenizer
    inner = getattr(tokenizer, "tokenizer", tokenizer)  # vLLM's mistral wrapper holds transformers' object
    state = inner.__dict__.get(STATE_ATTR) if hasattr(inner, "__dict__") else None
    ids = []
    for turn in chats:
        request = front.request(turn, cache_salt="tenant-a")
        ids.append(asyncio.run(front.chat(request))[0])
    table = None
    if state is not None:
        snap = state.current(inner)
        table = getattr(snap, "sessions", None)
    return {"renderer": type(renderer).__name__, "mode": tokenizer_args_from_config(renderer.model_config)[0],
            "wrapped": state is not None,
            "carrying": all(is_carrying(getattr(renderer, p)) for p in POOLS),
            "continued": None if table is None else table.stats["continued"] + table.stats["forked"],
            "stats": None if table is None else dict(table.stats), "ids": ids}


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    out = {m["name"]: _serve(m, spec["chats"]) for m in spec["models"]}
    Path(argv[1]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
