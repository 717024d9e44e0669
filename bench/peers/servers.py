"""The servers bench_serve measures delta-ray's Serve app against, each re-encoding every request whole.

* :func:`plain_server`: a uvicorn + FastAPI process with fastokens, stdlib json (what a user writes
  first; the demo's :mod:`.plain_server` is the tuned form: orjson, the engine's buffer, its segment
  cache);
* :func:`serve_peer`: a Ray Serve deployment with fastokens, orjson, numpy IDs.

No ``from __future__ import annotations``: FastAPI reads the handlers' annotations at run time.
"""
import json


def plain_server(tokenizer_path: str, port: int) -> None:
    """Serve ``POST /tokenize`` on ``port``: uvicorn + FastAPI, fastokens re-encoding the prompt whole,
    stdlib json both ways (until stopped)."""
    import fastokens
    import uvicorn
    from fastapi import FastAPI, Request, Response

    tok = fastokens.Tokenizer.from_file(tokenizer_path)
    app = FastAPI()

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = json.loads(await request.body())
        ids = tok.encode(body["prompt"], add_special_tokens=body.get("add_special_tokens", True)).ids
        return Response(json.dumps({"count": len(ids), "tokens": ids}), media_type="application/json")

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def serve_peer(config_bytes: bytes):
    """A Ray Serve application (bound, for ``serve.run``) re-encoding every prompt whole with fastokens:
    orjson both ways, the IDs from the engine's buffer."""
    from fastapi import FastAPI, Request, Response
    from ray import serve

    app = FastAPI()

    @serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=32)
    @serve.ingress(app)
    class WholePeer:
        def __init__(self, data: bytes):
            import fastokens
            self.tok = fastokens.Tokenizer.from_json_str(data.decode())

        @app.post("/tokenize")
        async def tokenize(self, request: Request):
            import numpy as np
            import orjson
            body = orjson.loads(await request.body())
            buf, _ = self.tok.encode_batch_flat([body["prompt"]],
                                                add_special_tokens=body.get("add_special_tokens", True))
            ids = np.frombuffer(buf, dtype="<u4").view("<i4")
            return Response(orjson.dumps({"count": len(ids), "tokens": ids}, option=orjson.OPT_SERIALIZE_NUMPY),
                            media_type="application/json")

    return WholePeer.bind(config_bytes)
