"""The tokenization server a user writes instead of delta-ray's Serve app (the demo's Serve peer).

uvicorn + FastAPI, fastokens loaded once with its segment cache (which helps chat: the transcript's
earlier messages are cached between added tokens), every request's text re-encoded whole, IDs
returned with orjson from the engine's buffer. Without fastokens it uses the reference.

    python bench/peers/plain_server.py TOKENIZER_JSON PORT

Run as a script, not ``-m``: importing ``delta_ray`` would pin fastokens to one thread per process
(delta-ray's setting), and the baseline runs with fastokens' own defaults.
"""
import sys  # no `from __future__ import annotations`: FastAPI reads the handler's annotations at run time


def make_app(path: str):
    """The FastAPI app: ``POST /tokenize {"prompt": text}`` -> ``{"count", "tokens"}``."""
    import numpy as np
    import orjson
    from fastapi import FastAPI, Request, Response

    try:
        import fastokens
        tok = fastokens.Tokenizer.from_file(path)
        if hasattr(tok, "enable_segment_cache"):
            tok.enable_segment_cache(512 << 20)

        def encode(text: str, add: bool) -> np.ndarray:
            buf, _ = tok.encode_batch_flat([text], add_special_tokens=add)
            return np.frombuffer(buf, dtype="<u4").view("<i4")
    except ImportError:
        from tokenizers import Tokenizer
        ref = Tokenizer.from_file(path)

        def encode(text: str, add: bool) -> np.ndarray:
            return np.asarray(ref.encode(text, add_special_tokens=add).ids, dtype=np.int32)

    app = FastAPI()

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        body = orjson.loads(await request.body())
        ids = encode(body["prompt"], body.get("add_special_tokens", True))
        return Response(orjson.dumps({"count": len(ids), "tokens": ids}, option=orjson.OPT_SERIALIZE_NUMPY),
                        media_type="application/json")

    return app


def main(argv: list[str]) -> None:
    import uvicorn
    path, port = argv[0], int(argv[1])
    uvicorn.run(make_app(path), host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main(sys.argv[1:])
