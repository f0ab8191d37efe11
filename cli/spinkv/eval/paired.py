"""Paired generation for the suite: every prompt is prefilled once per cache, then decoded
greedily and with each sampled seed from the same checkpoint, by fp16 and by every arm, with
the same sampler settings and seeds. Replies are kept untouched (no retries, no repairs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spinkv.eval.families import TaskPrompt
from spinkv.generation import PREFILL_BLOCK_TOKENS, chunked
from spinkv.sampling import SamplingParams

if TYPE_CHECKING:
    from spinkv.api import LoadedModel
    from spinkv.eval.prereg import Preregistration, Tier


@dataclass(frozen=True)
class Decoding:
    name: str
    """"greedy" or "seed<N>"."""
    sampling: SamplingParams

    @property
    def sampled(self) -> bool:
        return not self.sampling.is_greedy


def decodings(prereg: Preregistration, tier: Tier) -> list[Decoding]:
    """Greedy (exact argmax, no penalty) and one sampled decoding per preregistered seed."""
    s = prereg.sampling
    out = [Decoding("greedy", SamplingParams())]
    for seed in tier.sampled_seeds:
        params = SamplingParams(
            temperature=s["temperature"],
            top_k=int(s["top_k"]),
            top_p=s["top_p"],
            repetition_penalty=s["repetition_penalty"],
            repeat_last_n=int(s["repeat_last_n"]),
            seed=seed,
        )
        out.append(Decoding(f"seed{seed}", params))
    return out


@dataclass
class Reply:
    tokens: list[int]
    text: str
    finish: str
    """"stop" (EOS), "length" (max tokens) or "context" (the context limit)."""

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "tokens": len(self.tokens), "finish": self.finish}


def decode_reply(
    session: Any, sampler: Any, max_tokens: int, eos_ids: frozenset[int], limit: int
) -> tuple[list[int], str]:
    """The product's decode loop (spinkv.generation.TextStream): sample, stop on EOS, on
    max_tokens, or when the cache holds `limit` tokens; else decode the token."""
    out: list[int] = []
    while True:
        token = int(session.sample(sampler))
        if token in eos_ids:
            return out, "stop"
        out.append(token)
        if len(out) >= max_tokens:
            return out, "length"
        if len(session) >= limit:
            return out, "context"
        session.decode(token)


def run_prompt(
    model: LoadedModel, prompt: TaskPrompt, kv: dict[str, Any], decs: Sequence[Decoding]
) -> dict[str, Reply]:
    """One cache's replies to one prompt, one per decoding, each from the same prefilled
    state (checkpoint after the prompt, rollback after each reply)."""
    options = dict(kv)
    limit = prompt.context_limit or model.max_context
    if prompt.context_limit is not None:
        options["max_context"] = prompt.context_limit
    session = model.native.session(options)
    for chunk in chunked(prompt.token_ids, PREFILL_BLOCK_TOKENS):
        session.prefill(chunk)
    eos = frozenset(model.tokenizer.eos_token_ids)
    replies: dict[str, Reply] = {}
    for dec in decs:
        session.checkpoint()
        tokens, finish = decode_reply(
            session, dec.sampling.to_native(), prompt.max_tokens, eos, limit
        )
        session.rollback_turn()
        replies[dec.name] = Reply(tokens, model.detokenize(tokens), finish)
    return replies
