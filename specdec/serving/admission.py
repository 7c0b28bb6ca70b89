"""What an ``Engine`` takes as one request: its prompt encoded (text, token ids or a chat), its
settings and stops checked once, into a ``Request`` that fits the engine's context
(``RequestForm``)."""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import numpy as np

from specdec.decode.requests import Request
from specdec.errors import InvalidInputError
from specdec.generation.arguments import check_seed, sampling_config
from specdec.generation.encoding import encode_prompts

__all__ = ["RequestForm", "check_stops"]


def check_stops(stop, stop_token_ids) -> tuple[list[str], tuple[int, ...]]:
    """``stop`` (a string or a list of them) and ``stop_token_ids`` (token ids) checked by type
    and range, naming the argument."""
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not isinstance(stop, (list, tuple)):
        raise InvalidInputError(f"stop must be a string or a list of strings, got {stop!r}")
    stop = list(stop or ())
    if not all(isinstance(s, str) for s in stop):
        raise InvalidInputError(f"stop must be a string or a list of strings, got {stop!r}")
    if isinstance(stop_token_ids, (str, bytes)) or not isinstance(
        stop_token_ids, (list, tuple, range)
    ):
        raise InvalidInputError(
            f"stop_token_ids must be a list of token ids, got {stop_token_ids!r}"
        )
    if not all(
        isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0
        for t in stop_token_ids
    ):
        raise InvalidInputError(
            f"stop_token_ids must hold token ids (integers >= 0), got {list(stop_token_ids)!r}"
        )
    return stop, tuple(int(t) for t in stop_token_ids)


@attrs.frozen(kw_only=True)
class RequestForm:
    """An engine's limits on a request: the vocabulary, the context a request may use (prompt and
    new tokens), the default ``max_new_tokens``, the model's end tokens, its tokenizer and chat
    template."""

    vocab_size: int
    context_length: int
    max_new_tokens: int
    eos_token_ids: tuple = ()
    tokenizer: Any = None
    chat_template: str | None = None
    samples: bool = True  # the verifier draws sampled requests' tokens (VerifierCaps.samples)

    def encode(self, prompt: Any) -> list[int]:
        """Token ids of one prompt: text, token ids, or a chat (rendered with the model's
        template)."""
        prompts, batched = encode_prompts(
            prompt, self.tokenizer, self.vocab_size, chat_template=self.chat_template
        )
        if batched:
            raise InvalidInputError(
                "submit takes one prompt; submit each prompt of a batch on its own"
            )
        return prompts[0]

    def request(
        self,
        prompt: Any,
        *,
        max_new_tokens: int | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | Sequence[int] | None = None,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
    ) -> Request:
        """The checked ``Request`` of ``Engine.submit``'s arguments (a ``Request`` given as the
        prompt carries its own settings and is checked as it is)."""
        if isinstance(prompt, Request):
            given = (max_new_tokens, temperature, top_k, top_p, seed, tuple(stop_token_ids))
            if given + (ignore_eos,) != (None, 0.0, None, None, None, (), False):
                raise InvalidInputError(
                    "a Request carries its own settings: pass only stop= beside it"
                )
            self.check(prompt)
            return prompt
        sampling = sampling_config(temperature, top_k, top_p)
        check_seed(seed)
        eos = () if ignore_eos else self.eos_token_ids
        tokens = self.encode(prompt)
        if max_new_tokens is None:  # the default, as far as the context allows
            max_new_tokens = max(1, min(self.max_new_tokens, self.context_length - len(tokens)))
        request = Request(
            prompt=tokens,
            sampling=sampling,
            seed=seed,
            max_new_tokens=max_new_tokens,
            stop_token_ids=tuple(dict.fromkeys([*stop_token_ids, *eos])),
        )
        self.check(request, encoded=True)
        return request

    def check(self, request: Request, *, encoded: bool = False) -> None:
        """Raise InvalidInputError unless ``request`` fits: ids in the vocabulary (``encoded``:
        checked already), prompt and max_new_tokens within ``context_length``."""
        if not request.prompt:
            raise InvalidInputError("the prompt is empty: it needs at least one token")
        if not self.samples and not request.sampling.greedy:
            raise InvalidInputError(
                "this engine's verifier decodes greedily (it ignores temperature, top_k and "
                "top_p): send temperature 0, or give the engine a plan with the 'exact' verifier "
                "(specdec.decode_plan(..., verifier='exact'), what specdec.Engine(...) builds)"
            )
        bad = [] if encoded else [t for t in request.prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidInputError(
                f"the prompt has token ids outside the vocabulary [0, {self.vocab_size}): {bad[:8]}"
            )
        context, length = self.context_length, len(request.prompt)
        if length >= context:
            raise InvalidInputError(
                f"the prompt has {length} tokens; this engine's context holds {context}: shorten it"
            )
        if length + request.max_new_tokens > context:
            raise InvalidInputError(
                f"max_new_tokens={request.max_new_tokens} after a prompt of {length} tokens "
                f"exceeds this engine's context of {context} tokens: ask for at most "
                f"{context - length}"
            )
