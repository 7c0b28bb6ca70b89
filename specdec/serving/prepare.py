"""A request body turned into what the engine takes: parsed, checked and tokenized, on a worker
thread (``prepare`` is what the application runs with ``anyio.to_thread``), so that a huge or
slow request delays no other client's stream. Text is tokenized with the tokenizer's batch
entry point, which lets go of the interpreter lock while it runs; the same ids as ``encode``. A
text longer than the context could hold at ``CHARS_PER_TOKEN`` characters a token (or the
vocabulary's longest token, if longer) is refused before it is tokenized."""

from __future__ import annotations

import attrs

from specdec.errors import InvalidInputError
from specdec.generation.chat import ChatTemplateError, render_chat
from specdec.serving import body as json_body
from specdec.serving.errors import APIError, bad
from specdec.serving.fields import Settings, check_fields, messages_of, prompt_of


CHARS_PER_TOKEN = 64  # far beyond real text (3 to 5 characters a token)


@attrs.frozen
class Prepared:
    """A checked request: its body, settings, prompt ids and the field that holds the prompt."""

    body: dict
    settings: Settings
    tokens: list[int]
    prompt_param: str


def tokenize(tokenizer, text: str):
    """The encoding of ``text``, as ``tokenizer.encode(text)`` (a ``tokenizers.Tokenizer``): its
    ``len`` is the number of tokens, its ``ids`` the tokens (made only when asked for)."""
    return tokenizer.encode_batch([text])[0]


def too_long(count: int, context: int, param: str) -> APIError:
    return bad(
        f"This model's maximum context length is {context} tokens; the prompt has {count} tokens. "
        f"Shorten the {param}.",
        param,
        "context_length_exceeded",
    )


def max_prompt_chars(engine) -> int:
    """The characters beyond which a text prompt cannot fit ``engine``'s context: the context
    times ``CHARS_PER_TOKEN`` or the vocabulary's longest token, whichever is longer."""
    longest = 0
    get_vocab = getattr(engine.tokenizer, "get_vocab", None)
    if get_vocab is not None:
        longest = max(map(len, get_vocab()), default=0)
    return engine.context_length * max(CHARS_PER_TOKEN, longest)


def too_many_chars(count: int, context: int, limit: int, param: str) -> APIError:
    return bad(
        f"This model's maximum context length is {context} tokens; the prompt has {count} "
        f"characters, more than that many tokens can hold (at most {limit}). Shorten the {param}.",
        param,
        "context_length_exceeded",
    )


def encode(engine, prompt, param: str, max_chars: int) -> list[int]:
    """Token ids of a prompt (text, ids or a chat), as ``engine.encode`` gives them, its refusals
    400s naming ``param``; a text (or rendered chat) over ``max_chars`` characters is refused
    before it is tokenized."""
    context = engine.context_length
    try:
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], dict):  # token ids
            if len(prompt) >= context:  # refused for its length, without a pass over it
                raise too_long(len(prompt), context, param)
            return engine.encode(prompt)
        if isinstance(prompt, list):
            prompt = render_chat(engine.chat_template, prompt)
        if len(prompt) > max_chars:
            raise too_many_chars(len(prompt), context, max_chars, param)
        tokenizer = engine.tokenizer
        if not hasattr(tokenizer, "encode_batch"):  # a framework's own tokenizer
            return engine.encode(prompt)
        encoding = tokenize(tokenizer, prompt)
        if len(encoding) >= context:  # refused for its length, without making a list of its ids
            raise too_long(len(encoding), context, param)
        return engine.encode(list(encoding.ids))
    except ChatTemplateError as error:  # failed or over its budget: said without the file's path
        raise bad(error.detail, param) from None
    except InvalidInputError as error:
        raise bad(str(error), param) from None


def prepare(
    raw: bytes, *, chat: bool, engine, names: tuple[str, ...], max_chars: int | None = None
) -> Prepared:
    """Parse and check a completions (``chat=False``) or chat-completions body and tokenize its
    prompt (``max_chars``: ``max_prompt_chars(engine)`` unless given); raises APIError (400, or
    404 for a model this server does not serve)."""
    body = json_body.parse(raw)
    check_fields(body, chat=chat)
    model = body.get("model")
    if model is not None and model not in names:
        raise APIError(
            404,
            f"The model {model[:200]!r} does not exist; this server serves {names[0]!r}",
            param="model",
            code="model_not_found",
        )
    settings = Settings(body, chat=chat, vocab=int(engine.target.vocab_size))
    if chat:
        prompt_param, prompt = "messages", messages_of(body)
        if engine.chat_template is None:
            raise bad("this model has no chat template: use /v1/completions", "messages")
    else:
        prompt_param, prompt = "prompt", prompt_of(body)
    if max_chars is None:
        max_chars = max_prompt_chars(engine)
    return Prepared(body, settings, encode(engine, prompt, prompt_param, max_chars), prompt_param)
