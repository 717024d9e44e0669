"""The HTTP tokenization service without Ray: the request handler, its ASGI app, and the one-process
server (``delta-ray serve --local``, started by ``apps/serve_cli.py``). Ray Serve (``actors/serve.py``) runs the same
handler and app in each replica."""
