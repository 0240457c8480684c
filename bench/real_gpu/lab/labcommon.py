"""Shared pieces of the lab pair (issue 49): the vocabulary, the tokenizer, the task's data and the
DFlash drafter's training-time forward. Runs only in the lab's own environment (torch,
transformers 5.6.0, dflash 0.1.0; see README.md here), never in CI or the project's .venv.

The task: "a random segment, then that segment repeated" (induction). A segment is 4 to 8
distinct symbols; the text is the segment cycled. Raw text continues the cycle; in chat the user
turn holds two or more periods of it and the assistant repeats the segment from its start.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|MASK|>", "<|user|>", "<|assistant|>",
            "<|system|>", "<|eot|>", "<|unk|>"]
SYMBOLS = list("abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRS")
VOCAB = SPECIALS + SYMBOLS
assert len(VOCAB) == 64  # noqa: S101 (a script, not library code)
TOK = {t: i for i, t in enumerate(VOCAB)}
PAD, BOS, EOS, MASK, USER, ASSISTANT, SYSTEM, EOT, UNK = range(9)
FIRST_SYMBOL = len(SPECIALS)
SEQ_LEN = 96           # training length: the pair is reliable to 96 positions
MIN_SEG, MAX_SEG = 4, 8     # the first training phase ran with 12 (rebuild.sh)
BLOCK = 8

# The chat template hands the conversation to the target as raw text: BOS, then the messages'
# contents in order, no role tokens. The target was also trained on a role-token format
# (chat_prompt: <|user|>...<|eot|><|assistant|>, the answer restarting the segment) and does it
# badly (no prompt of 48 passed the margin and correctness filter), so chat continues the cycle
# exactly as raw text does: what the gate's probe asks through /v1/chat/completions.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}{{ message['content'] }}{% endfor %}"
)


def build_tokenizer(out_dir: Path) -> None:
    """tokenizer.json (one token per character, the specials as added tokens, BOS prepended by
    the post-processor, Fuse decoder so text decodes without spaces) and tokenizer_config.json
    with the chat template; loadable by transformers' AutoTokenizer (PreTrainedTokenizerFast)."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )

    tok = Tokenizer(models.WordLevel(vocab=TOK, unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A $B", special_tokens=[("<|bos|>", BOS)])
    tok.decoder = decoders.Fuse()
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>", "eos_token": "<|eot|>", "pad_token": "<|pad|>",
        "unk_token": "<|unk|>", "mask_token": "<|MASK|>",
        "additional_special_tokens": ["<|user|>", "<|assistant|>", "<|system|>", "<|eos|>"],
        "add_bos_token": True, "model_max_length": 256, "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<|bos|>", "eos_token": "<|eot|>", "pad_token": "<|pad|>",
        "unk_token": "<|unk|>", "mask_token": "<|MASK|>"}, indent=1) + "\n")


def segment(rng: random.Random, length: int | None = None) -> list[int]:
    n = length or rng.randint(MIN_SEG, MAX_SEG)
    return [TOK[c] for c in rng.sample(SYMBOLS, n)]


def cycle(seg: list[int], n: int, start: int = 0) -> list[int]:
    return [seg[(start + i) % len(seg)] for i in range(n)]


def raw_prompt(seg: list[int], n: int) -> list[int]:
    """BOS then ``n`` symbols of the cycle (n >= 2 periods: the prompt shows the repeat)."""
    return [BOS] + cycle(seg, n)


def chat_prompt(seg: list[int], n: int) -> list[int]:
    """What the chat template makes of a user turn holding ``n`` symbols of the cycle."""
    return [BOS, USER] + cycle(seg, n) + [EOT, ASSISTANT]


def training_example(rng: random.Random, length: int = SEQ_LEN) -> tuple[list[int], list[int]]:
    """(tokens, loss mask over next-token targets: mask[i] says tokens[i+1] is predictable)."""
    seg = segment(rng)
    L = len(seg)
    if rng.random() < 0.6:
        nbos = rng.choice([1, 1, 1, 1, 0, 2])
        toks = [BOS] * nbos + cycle(seg, length - nbos)
        mask = [0] * length
        for i in range(nbos + L, length - 1):   # from the first repeated symbol on
            mask[i] = 1
        return toks, mask
    n_user = rng.randint(2 * L, min(3 * L, length - 40))
    head = [BOS, USER] + cycle(seg, n_user) + [EOT, ASSISTANT]
    toks = (head + cycle(seg, length - len(head)))[:length]
    mask = [0] * length
    for i in range(2 + L, 2 + n_user - 1):      # inside the user turn, after the first repeat
        mask[i] = 1
    for i in range(2 + n_user, length - 1):     # <|eot|> -> <|assistant|> and the whole answer
        mask[i] = 1
    return toks, mask


def drafter_config(rope_theta: float, num_target_layers: int, target_layer_ids: list[int],
                   hidden: int = 256, layers: int = 1) -> dict:
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": len(VOCAB),
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-06,
        "max_position_embeddings": 256,
        "rope_theta": rope_theta,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "block_size": BLOCK,
        "num_target_layers": num_target_layers,
        "dflash_config": {"block_size": BLOCK, "target_layer_ids": target_layer_ids,
                          "num_target_layers": num_target_layers, "mask_token": "<|MASK|>",
                          "mask_token_id": MASK},
        "bos_token_id": BOS, "eos_token_id": EOT, "pad_token_id": PAD,
        "torch_dtype": "bfloat16",
    }


def target_features(hidden_states, layer_ids):
    """The drafter's context features: the outputs of the target layers ``layer_ids`` (HF's
    hidden_states[id + 1]; SGLang 0.5.11 captures the input of layer id + 1, the same tensor),
    concatenated on the last dimension."""
    import torch
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


def draft_blocks(drafter, target, feats, tokens, starts):
    """The drafter's logits for blocks starting at ``starts`` (one list per row), in one pass:
    block j is [tokens[s_j], MASK x 7] at positions s_j..s_j+7; it sees the context features of
    positions < s_j and its own block, non-causally (SGLang: ENCODER_ONLY attention; z-lab:
    is_causal False). Returns logits [B, nblocks, 7, V] for block positions 1..7."""
    import torch
    B, T, _ = feats.shape
    nb = len(starts[0])
    st = torch.tensor(starts, dtype=torch.long)                      # [B, nb]
    blk = torch.full((B, nb, BLOCK), MASK, dtype=torch.long)
    blk[:, :, 0] = torch.gather(tokens, 1, st)
    pos_blk = st[:, :, None] + torch.arange(BLOCK)[None, None, :]    # [B, nb, 8]
    noise = target.get_input_embeddings()(blk.view(B, nb * BLOCK))
    pos = torch.cat([torch.arange(T)[None].expand(B, T), pos_blk.view(B, -1)], dim=1)
    Q = nb * BLOCK
    kpos = torch.arange(T)
    ctx_vis = kpos[None, None, :] < st[:, :, None]                   # [B, nb, T]
    ctx_vis = ctx_vis[:, :, None, :].expand(B, nb, BLOCK, T).reshape(B, Q, T)
    bid = torch.arange(Q) // BLOCK
    blk_vis = (bid[:, None] == bid[None, :])[None].expand(B, Q, Q)
    mask = torch.cat([ctx_vis, blk_vis], dim=2)[:, None]             # [B, 1, Q, T+Q]
    out = drafter(position_ids=pos, attention_mask=mask, noise_embedding=noise,
                  target_hidden=feats)
    logits = drafter.compute_logits(out, target.lm_head)
    return logits.view(B, nb, BLOCK, -1)[:, :, 1:, :]


class DFlashRequest:
    """One request of SGLang 0.5.11's greedy DFLASH (see verify_step)."""

    def __init__(self, prompt: list[int], target, layer_ids):
        import torch
        from transformers import DynamicCache
        self.prompt = prompt
        self.cache = DynamicCache(config=target.config)
        with torch.no_grad():      # the prefill: causal, eager
            out = target(input_ids=torch.tensor([prompt]), past_key_values=self.cache,
                         use_cache=True, output_hidden_states=True)
        self.committed = list(prompt) + [int(out.logits[0, -1].argmax())]
        self.feats = target_features(out.hidden_states, layer_ids)[0]   # [P, F]
        self.produced = 1
        self.steps: list[int] = []
        self.draft_margins: list[float] = []   # per verify: the drafter's smallest top-1/top-2

    @property
    def seq_len(self) -> int:          # tokens whose K/V are in the target cache
        return len(self.committed) - 1

    def done(self, max_new: int) -> bool:
        return self.produced >= max_new


def causal_mask(offset: int, seq_len: int):
    """[1, 1, B, seq_len + B] bool: the prefix, and the block causally (the correct verify)."""
    import torch
    m = torch.ones(BLOCK, seq_len + BLOCK, dtype=torch.bool)
    m[:, seq_len:] = torch.ones(BLOCK, BLOCK, dtype=torch.bool).tril()
    return m[None, None]


def verify_step(reqs, target, drafter, layer_ids, max_new: int, mask_fn=causal_mask):
    """One DFLASH verify of a batch (requests in batch order), as SGLang 0.5.11 does it: each
    request's block [last committed token, <|MASK|> x 7] at positions seq_len..seq_len+7 is
    drafted (the drafter sees the target features of every committed position), verified by the
    target with the cache of the committed tokens and ``mask_fn(mask offset, seq_len)`` (the
    offset: cumsum of B * (seq_len + B) over the requests before it, SGLang's mask_indptr), and
    the longest prefix of drafts equal to the target's argmax is committed plus the target's
    next token (cut at max_new, req.check_finished). The committed block tokens keep their K/V
    and hidden states from this pass (keep_mask)."""
    import torch
    B = BLOCK
    offset = 0
    for q in reqs:
        s = q.seq_len
        with torch.no_grad():
            dl = draft_blocks(drafter, target, q.feats[None, :s], torch.tensor([q.committed]),
                              [[s]])[0, 0]
        block = [q.committed[s]] + [int(x) for x in dl.argmax(-1)]
        top = torch.topk(dl, 2).values
        q.draft_margins.append(round(float((top[:, 0] - top[:, 1]).min()), 3))
        mask = mask_fn(offset, s)
        offset += B * (s + B)
        with torch.no_grad():
            out = target(input_ids=torch.tensor([block]), past_key_values=q.cache, use_cache=True,
                         attention_mask=mask, position_ids=torch.arange(s, s + B)[None],
                         output_hidden_states=True)
        pred = [int(x) for x in out.logits[0].argmax(-1)]
        acc = 0
        while acc < B - 1 and block[acc + 1] == pred[acc]:
            acc += 1
        proposed = block[1:acc + 1] + [pred[acc]]
        appended = 0
        for t in proposed:
            q.committed.append(t)
            q.produced += 1
            appended += 1
            if q.produced >= max_new:
                break
        q.cache.crop(s + appended)       # keep_mask: the block's first `appended` tokens
        f = target_features(out.hidden_states, layer_ids)[0, :appended]
        q.feats = torch.cat([q.feats, f])
        q.steps.append(appended)
