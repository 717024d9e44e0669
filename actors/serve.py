"""Ray Serve: delta-ray as an HTTP service and as a deployment other deployments call.

``serve_app(tokenizer, **options)`` returns an application for ``serve.run``. Its HTTP API is that
of vLLM's and SGLang's OpenAI-compatible servers (``POST /tokenize``, ``POST /detokenize``,
``GET /health``), so existing clients work; a ``DeploymentHandle`` can call ``tokenize`` and
``detokenize`` with the same JSON bodies (model composition).
"""


import functools
import json
import logging
from typing import Any

from delta_ray.loading import TokenizerLike, load_tokenizer

log = logging.getLogger("delta_ray.serve")
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
OFF_LOOP_BYTES = 256 * 1024  # bodies larger than this are parsed and serialized in a thread


def _many_tokens(result: dict) -> bool:
    tokens = result.get("tokens")
    return tokens is not None and len(tokens) > 65536


def _chat_config(tokenizer: Any, tokenizer_config: Any) -> "dict | None":
    """The tokenizer_config.json to take the chat template from (explicit, beside the file, or bundled)."""
    from pathlib import Path

    if isinstance(tokenizer_config, dict):
        return tokenizer_config
    candidates = []
    if tokenizer_config is not None:
        candidates.append(Path(tokenizer_config))
    if isinstance(tokenizer, (str, Path)):
        p = Path(tokenizer)
        candidates.append((p if p.is_dir() else p.parent) / "tokenizer_config.json")
    for c in candidates:
        c = c / "tokenizer_config.json" if c.is_dir() else c
        if c.exists():
            return json.loads(c.read_text(encoding="utf-8"))
    return None


def serve_app(tokenizer: TokenizerLike, *, model_name: "str | None" = None, pool_name: "str | None" = None,
              num_workers: "int | None" = None, num_replicas: int = 1, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              max_model_len: "int | None" = None, tokenizer_config: Any = None, replica_cpus: float = 0.25,
              require_tenant: bool = False, pool_secret: "str | None" = None, **pool_options: Any):
    """A Ray Serve application serving exact tokenization for one tokenizer.

    With ``pool_name`` the replicas attach to a running named ``TokenizerPool``
    (``TokenizerPool(..., name=...)``, whose ``secret.hex()`` goes in ``pool_secret`` or
    ``$DELTA_RAY_POOL_SECRET``) so several replicas share its workers; otherwise each replica
    starts its own pool of ``num_workers`` workers. ``require_tenant`` refuses requests without a
    ``cache_salt``: session ids are then private to a tenant, never names shared by all callers.
    """
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from ray import serve

    loaded = load_tokenizer(tokenizer)
    config = _chat_config(tokenizer, tokenizer_config)
    if max_model_len is None and config:
        mml = config.get("model_max_length")
        max_model_len = mml if isinstance(mml, int) and mml < 10 ** 12 else None
    name = model_name or (loaded.source if loaded.source.startswith("<") else None) or "delta-ray"
    app = FastAPI(title="delta-ray", description="Exact tokenization (vLLM/SGLang-compatible /tokenize)")
    init_args = dict(config_bytes=loaded.config_bytes, digest=loaded.digest, chat_config=config,
                     pool_name=pool_name, num_workers=num_workers, max_body_bytes=max_body_bytes,
                     max_model_len=max_model_len, model_name=name, pool_options=pool_options,
                     require_tenant=require_tenant, pool_secret=pool_secret)

    @serve.deployment(num_replicas=num_replicas, ray_actor_options={"num_cpus": replica_cpus})
    @serve.ingress(app)
    class TokenizerService:
        def __init__(self, config_bytes, digest, chat_config, pool_name, num_workers, max_body_bytes,
                     max_model_len, model_name, pool_options, require_tenant=False, pool_secret=None):
            from delta_ray.chat_template import ChatTemplate
            from delta_ray.loading import LoadedTokenizer

            from .pool import TokenizerPool

            loaded = LoadedTokenizer.from_bytes(config_bytes, expected_digest=digest)
            self.pool = (TokenizerPool.connect(pool_name, pool_secret) if pool_name
                         else TokenizerPool(loaded, num_workers=num_workers, **pool_options))
            self.require_tenant = require_tenant
            self.tok = loaded.tokenizer
            self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
            self.template = ChatTemplate.from_config(chat_config)
            self.max_body = max_body_bytes
            self.max_model_len = max_model_len
            self.served = {model_name}

        def __del__(self):
            try:
                self.pool.close()
            except Exception:  # noqa: BLE001
                pass

        # -- handle API (model composition): same JSON bodies as HTTP ------------------------
        async def tokenize(self, body: dict) -> dict:
            out = await self._tokenize_body(body)
            out["tokens"] = out["tokens"].tolist()
            return out

        async def _tokenize_body(self, body: dict) -> dict:
            from .http_api import BadRequest, parse_tokenize
            req = parse_tokenize(body, self.served)
            if self.require_tenant and req.tenant is None:
                raise BadRequest("this service requires a tenant: give 'cache_salt'", 400)
            return await self._tokenize(req)

        async def detokenize(self, body: dict) -> dict:
            import asyncio

            from .http_api import parse_detokenize
            tokens = parse_detokenize(body, self.served, self.vocab_size)
            if len(tokens) > 65536:
                return {"prompt": await asyncio.to_thread(self.pool.decode, tokens)}
            return {"prompt": self.pool.decode(tokens)}

        # -- HTTP ----------------------------------------------------------------------------
        @app.get("/health")
        async def health(self):
            return Response(status_code=200)

        @app.post("/tokenize")
        async def tokenize_http(self, request: Request):
            return await self._http("tokenize", request, self._tokenize_body)

        @app.post("/detokenize")
        async def detokenize_http(self, request: Request):
            return await self._http("detokenize", request, self.detokenize)

        async def _http(self, endpoint: str, request: Request, handler):
            from . import metrics
            from .http_api import BadRequest
            from delta_ray.chat_template import ChatTemplateError
            import asyncio

            from .http_api import dumps_json, loads_json
            status = 200
            try:
                length = request.headers.get("content-length")
                if length is not None and length.isdigit() and int(length) > self.max_body:
                    raise BadRequest(f"body of {length} bytes exceeds the limit of {self.max_body}", 413)
                raw = await self._read_body(request)
                # CPU-heavy steps of a large body (parse, chat rendering, serialization) run off the
                # event loop, so one 3 MiB chat does not stall every other request on this replica.
                big = len(raw) > OFF_LOOP_BYTES
                body = await asyncio.to_thread(loads_json, raw) if big else loads_json(raw)
                del raw
                result = await handler(body)
                data = await asyncio.to_thread(dumps_json, result) if big or _many_tokens(result) else dumps_json(result)
                return Response(data, media_type="application/json")
            except BadRequest as exc:
                status = exc.status
                return JSONResponse({"error": {"message": str(exc), "type": "BadRequestError", "code": status}},
                                    status_code=status)
            except (ChatTemplateError, ValueError, TypeError) as exc:
                status = 400
                return JSONResponse({"error": {"message": str(exc), "type": "BadRequestError", "code": 400}},
                                    status_code=400)
            except RecursionError:
                status = 400
                return JSONResponse({"error": {"message": "the request is nested too deeply", "type": "BadRequestError",
                                               "code": 400}}, status_code=400)
            except Exception:  # noqa: BLE001 - this request alone fails; internals stay in the log
                import uuid
                status = 500
                ref = uuid.uuid4().hex[:12]
                log.exception("internal error on /%s (ref %s)", endpoint, ref)
                return JSONResponse({"error": {"message": f"internal error (ref {ref})",
                                               "type": "InternalServerError", "code": 500}}, status_code=500)
            finally:
                metrics.record_http(endpoint, status)

        async def _read_body(self, request: Request) -> bytes:
            """The body, refused with 413 as soon as it streams past the limit (chunked uploads too)."""
            from .http_api import BadRequest
            parts, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.max_body:
                    raise BadRequest(f"body exceeds the limit of {self.max_body} bytes", 413)
                parts.append(chunk)
            return b"".join(parts)

        async def _tokenize(self, req) -> dict:
            from .http_api import BadRequest, session_key
            from delta_ray.scheduler import content_key
            import asyncio

            from delta_ray import constants as C

            from .http_api import content_session_key
            if req.append is not None:
                # Append over HTTP: only the delta travels in, only the IDs that changed travel out.
                from delta_ray.session_store import SessionNotFound
                try:
                    start, count, tail = await self.pool.extend_tail_async(
                        session_key(req.session, req.tenant), req.append, add_special_tokens=req.add_special_tokens)
                except SessionNotFound as exc:
                    raise BadRequest(f"{exc}", 409) from None
                return {"count": count, "max_model_len": self.max_model_len, "start": start, "tokens": tail}
            if req.messages is not None:
                if self.template is None:
                    raise BadRequest("this tokenizer has no chat template: send 'prompt'")
                render = functools.partial(self.template.render, req.messages,
                                           add_generation_prompt=req.add_generation_prompt, tools=req.tools,
                                           **req.chat_template_kwargs)
                text = await asyncio.to_thread(render) if len(req.messages) > 64 else render()
            else:
                text = req.prompt
            key = session_key(req.session, req.tenant)
            if key is None and len(text) * 4 >= C.LOCAL_MAX_BYTES and \
                    len(text.encode("utf-8", "surrogatepass")) >= C.LOCAL_MAX_BYTES:
                # Keyless long prompts are reused by content, always inside the caller's tenant, so
                # one tenant's timing can never reveal another's text.
                key = content_session_key(content_key(text), req.tenant)
            ids = await self.pool.encode_async(text, session=key, add_special_tokens=req.add_special_tokens)
            tokens = ids.to_numpy(zero_copy_only=False)
            out = {"count": int(len(tokens)), "max_model_len": self.max_model_len, "tokens": tokens}
            if req.return_token_strs:
                out["token_strs"] = [self.tok.id_to_token(int(t)) for t in tokens]
            return out

    return TokenizerService.bind(**init_args)
