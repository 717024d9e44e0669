"""Ray-free validation of the /tokenize and /detokenize bodies."""
from __future__ import annotations

import pytest

from actors.http_api import BadRequest, parse_detokenize, parse_tokenize, session_key


def test_prompt_and_defaults():
    r = parse_tokenize({"prompt": "hi", "model": "m"}, {"m"})
    assert r.prompt == "hi" and r.add_special_tokens is True and r.session is None
    r = parse_tokenize({"messages": [{"role": "user", "content": "x"}]}, {"m"})
    assert r.add_special_tokens is False and r.add_generation_prompt is True


@pytest.mark.parametrize("body, status", [
    ([], 400), ({"prompt": 1}, 400), ({"prompt": "x", "zzz": 0}, 400), ({}, 400),
    ({"prompt": "x", "messages": []}, 400), ({"prompt": "x", "model": "other"}, 404),
    ({"messages": ["x"]}, 400), ({"prompt": "x", "session_id": ""}, 400),
    ({"prompt": "x", "continue_final_message": True}, 400), ({"prompt": "x", "return_token_strs": 1}, 400),
])
def test_bad_tokenize_bodies(body, status):
    with pytest.raises(BadRequest) as info:
        parse_tokenize(body, {"m"})
    assert info.value.status == status and str(info.value)


def test_detokenize_and_sessions():
    assert parse_detokenize({"tokens": [0, 5]}, set(), 10) == [0, 5]
    for bad in ({"tokens": [10]}, {"tokens": [True]}, {"tokens": "x"}, {"tokens": [1], "x": 1}):
        with pytest.raises(BadRequest):
            parse_detokenize(bad, set(), 10)
    assert session_key("s", "a") != session_key("s", "b") != session_key("s", None)
    assert session_key(None, "a") is None
