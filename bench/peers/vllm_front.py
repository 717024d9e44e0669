"""vLLM's OpenAI chat front end on the CPU, without a model: its own request path up to the engine.

A served chat request goes ``OpenAIServingChat.create_chat_completion`` -> ``OnlineRenderer`` ->
the tokenizer mode's renderer (render the chat, tokenize it on the renderer's thread pool) -> the
engine client's ``generate(engine_input, ...)``. Here everything is vLLM's own (0.33 or 0.34) except
the engine client, :class:`RecordingEngine`, which records each request's prompt IDs and the moment
they arrived, and answers one token. Building it needs a model folder with a ``config.json`` (no
weights are read) and ``VLLM_TARGET_DEVICE=cpu`` where no GPU is (set here before vLLM is imported).

Used by ``bench/bench_frontend.py`` and the vLLM tier (``tests/apps/test_dropin_vllm.py``); it needs
the vLLM tier's environment (``tests/tools/vllm_tier.py`` builds ``.venv-vllm``).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # read when vLLM picks its platform

# A small model of each bundled tokenizer's architecture: vLLM reads the config, never weights.
CONFIGS: dict[str, dict[str, Any]] = {
    "qwen-3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
               "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
               "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 1 << 21,
               "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
               "tie_word_embeddings": True, "bos_token_id": 151643, "eos_token_id": 151645},
    # vLLM picks its `deepseek_v4` mode (DeepSeek's Python prompt encoder) for this architecture
    "deepseek-v4": {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "vocab_size": 129280,
                    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
                    "num_key_value_heads": 1, "max_position_embeddings": 1 << 20, "torch_dtype": "bfloat16"},
    "mistral": {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 131072,
                "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
                "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 1 << 20,
                "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5, "rope_theta": 1000000.0},
}


def model_folder(name: str, root: str | Path) -> str:
    """A folder vLLM serves: the bundled tokenizer ``name`` (as transformers loads it) and a config."""
    from delta_ray.apps.dropin.folders import bundled_hf_folder
    folder = bundled_hf_folder(name, root)
    (Path(folder) / "config.json").write_text(json.dumps(CONFIGS[name]))
    return folder


def folder_with_config(tokenizer_folder: str | Path, config: str, root: str | Path) -> str:
    """A folder vLLM serves: the files of ``tokenizer_folder`` (a zoo tokenizer's, say) and the
    config ``CONFIGS[config]``."""
    import shutil
    folder = Path(root) / f"{Path(tokenizer_folder).name}-{config}"
    folder.mkdir(parents=True, exist_ok=True)
    for path in Path(tokenizer_folder).iterdir():
        if path.is_file():
            shutil.copy(path, folder / path.name)
    (folder / "config.json").write_text(json.dumps(CONFIGS[config]))
    return str(folder)


def vllm_config_on_cpu(model_config):
    """``VllmConfig(model_config=model_config)`` on this CPU. vLLM 0.34's CPU platform refuses an x86
    CPU without triton-cpu (``CpuPlatform.check_and_update_config``, vllm/platforms/cpu.py:242), which
    only its model runner needs: no model runs here (0.33 only warned). So that check, which reads
    ``vllm.triton_utils.HAS_TRITON`` when it runs, sees Triton while the config is built."""
    import vllm.triton_utils as triton_utils
    from vllm.config import VllmConfig
    had = triton_utils.HAS_TRITON
    triton_utils.HAS_TRITON = True
    try:
        return VllmConfig(model_config=model_config)
    finally:
        triton_utils.HAS_TRITON = had


class RecordingEngine:
    """vLLM's ``EngineClient`` as far as the chat front end uses it: ``generate`` records
    ``seen[request_id] = (prompt_token_ids, perf_counter())`` when the prompt arrives, and answers one
    token."""

    errored = False
    dead_error = None

    def __init__(self, vllm_config, renderer):
        self.vllm_config, self.model_config, self.renderer = vllm_config, vllm_config.model_config, renderer
        self.input_processor = None
        self.seen: dict[str, tuple[list[int], float]] = {}

    def check_admission(self, n: int) -> None:
        pass

    async def generate(self, engine_input, sampling_params, request_id, **kwargs):
        from vllm.outputs import CompletionOutput, RequestOutput
        ids = engine_input["prompt_token_ids"]
        self.seen[request_id] = (ids, time.perf_counter())
        yield RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=ids, prompt_logprobs=None,
                            outputs=[CompletionOutput(index=0, text=".", token_ids=[13], cumulative_logprob=None,
                                                      logprobs=None, finish_reason="stop")],
                            finished=True)


class FrontEnd:
    """One model served by vLLM's chat front end with ``tokenizer_mode=mode``."""

    def __init__(self, folder: str, mode: str, max_model_len: int = 1 << 21):
        from vllm.config import ModelConfig
        from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
        from vllm.entrypoints.openai.models.serving import BaseModelPath, OpenAIServingModels
        from vllm.plugins import load_general_plugins
        from vllm.renderers.online_renderer import OnlineRenderer
        from vllm.renderers.registry import renderer_from_config

        load_general_plugins()  # as every vLLM process does: delta-ray's entry point registers its mode
        model_config = ModelConfig(model=folder, tokenizer_mode=mode, max_model_len=max_model_len)
        config = vllm_config_on_cpu(model_config)
        self.renderer = renderer_from_config(config)
        self.engine = RecordingEngine(config, self.renderer)
        models = OpenAIServingModels(self.engine, [BaseModelPath(name="model", model_path=folder)])
        online = OnlineRenderer(model_config=model_config, renderer=self.renderer, request_logger=None,
                                chat_template=None, chat_template_content_format="auto")
        self.serving = OpenAIServingChat(self.engine, models, "assistant", online_renderer=online,
                                         request_logger=None, chat_template=None,
                                         chat_template_content_format="auto")

    def request(self, messages: list[dict], cache_salt: str | None = None, **fields):
        """The ``ChatCompletionRequest`` a client's JSON body becomes (one output token)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        return ChatCompletionRequest(model="model", messages=messages, max_completion_tokens=1, cache_salt=cache_salt,
                                     **fields)

    async def chat(self, request) -> tuple[list[int], float]:
        """Serve ``request`` through vLLM's chat front end; returns the prompt IDs the engine got and
        when (``perf_counter``) they reached it."""
        response = await self.serving.create_chat_completion(request, None)
        got = self.engine.seen.pop(f"chatcmpl-{request.request_id}", None)  # vLLM's id for a request
        if got is None:
            raise RuntimeError(f"vLLM's front end refused the request: {response}")
        return got
