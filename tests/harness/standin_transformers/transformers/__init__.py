"""A stand-in for ``transformers`` (named as one: the real package and a model's tokenizer files
are not here), for the readiness gate's chat-template step (``readiness_gate.chat_prompts``).

``AutoTokenizer.from_pretrained(path)`` reads ``path/tokenizer_config.json``'s ``chat_template``
and, as transformers' ``apply_chat_template`` does, renders it with jinja2 (trim_blocks,
lstrip_blocks, the messages, ``add_generation_prompt`` and the extra kwargs). Its "tokens" are
the rendered text's characters (``ord``), so a test can read back what was templated."""

from __future__ import annotations

import json
import os


class _Tokenizer:
    def __init__(self, template: str):
        self.template = template

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False,
                            **kwargs):
        import jinja2

        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        text = env.from_string(self.template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **kwargs)
        if not tokenize:
            return text
        return {"input_ids": [ord(ch) for ch in text]}


class AutoTokenizer:
    @staticmethod
    def from_pretrained(path, trust_remote_code=False, **_):
        with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
        if config.get("auto_map") and not trust_remote_code:
            raise ValueError("this tokenizer needs trust_remote_code=True")
        return _Tokenizer(config["chat_template"])
