"""Run by tests/serve/test_local_server.py in a fresh process: ``delta-ray serve --local`` answers the
API (a session, an append, a chat, /detokenize) exactly, and Ray is never imported.

The CLI runs in the main thread as a user starts it; a client thread checks the answers against
the reference, then the set of imported modules, and ends the process with the verdict.
"""
import json
import os
import socket
import sys
import threading
import time
import urllib.request

from tokenizers import Tokenizer

from delta_ray.apps.bundled import bundled_tokenizer_path


def post(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def client(port: int) -> None:
    try:
        ref = Tokenizer.from_file(bundled_tokenizer_path("qwen-3"))
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        text = "A session over HTTP without Ray. " * 400
        out = post(port, "/tokenize", {"prompt": text, "session_id": "s", "cache_salt": "t"})
        assert out["tokens"] == ref.encode(text).ids
        ids = out["tokens"]
        out = post(port, "/tokenize", {"append": " And one more turn.", "session_id": "s", "cache_salt": "t",
                                       "session_version": out["session_version"]})
        assert ids[:out["start"]] + out["tokens"] == ref.encode(text + " And one more turn.").ids
        long_text = "Keyless text cut over the cores. " * 4000  # past cut_threshold: pieces on threads
        assert post(port, "/tokenize", {"prompt": long_text})["tokens"] == ref.encode(long_text).ids
        chat = post(port, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
        assert post(port, "/detokenize", {"tokens": chat["tokens"]})["prompt"] == ref.decode(chat["tokens"])
        ray = sorted(m for m in sys.modules if m == "ray" or m.startswith("ray."))
        assert not ray, f"Ray was imported: {ray[:5]}"
        print("LOCAL NO RAY OK", flush=True)
        os._exit(0)
    except BaseException as exc:  # noqa: BLE001 - the verdict is the exit status
        print(f"FAILED: {exc!r}", flush=True)
        os._exit(1)


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    threading.Thread(target=client, args=(port,), daemon=True).start()
    from delta_ray.apps.cli import main as cli
    cli(["serve", "--local", "--tokenizer", "qwen-3", "--port", str(port)])
    print("FAILED: the server stopped before the client's verdict", flush=True)
    os._exit(1)


if __name__ == "__main__":
    main()
