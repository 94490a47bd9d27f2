"""API request -> GenerationJob: the daemon's validation of one request against its limits
(max_tokens, prompt length, the draft's context) and the model it serves; raises ApiError
subclasses (edge/daemon/errors.py) with the field they name.

Chat prompts: the tokenizer's own chat template when it has one (edge/daemon/chat_template.py);
the shipped code models have none, so theirs is the documented plain join of the contents.
An empty prompt starts a new document: the end-of-text token the model saw between files.
"""
from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from edge.config import DaemonConfig
from edge.daemon.chat_template import ChatTemplate, TemplateError, plain_chat_prompt
from edge.daemon.errors import BadRequest, ContextLengthExceeded, ModelNotFound
from edge.daemon.openai_schema import (ChatCompletionRequest, ChatMessageIn, CompletionRequest,
                                       ModelCard, ModelList)
from edge.request import OPTIONS, GenerationRequest
from edge.tokenizer import EdgeTokenizer
from tandem.sampling import SamplingParams


def chat_prompt(messages: Sequence[ChatMessageIn]) -> str:
    """The documented plain prompt of the shipped code models (see chat_template.py)."""
    return plain_chat_prompt([message.template_dict() for message in messages])


@dataclass(frozen=True)
class GenerationJob:
    """One validated generation: the client's request, built once here (edge/request.py), and
    what only the daemon's text output needs."""
    request: GenerationRequest
    stop_strings: tuple[str, ...] = ()
    trace: bool = False               # return the per-round trace in the stats


class JobFactory:
    """Builds and checks jobs; tokenizes (call it off the event loop)."""

    def __init__(self, config: DaemonConfig, tokenizer: EdgeTokenizer, context_limit: int) -> None:
        """`context_limit`: most tokens prompt + output may hold (the draft's n_ctx)."""
        self.config = config
        self.tokenizer = tokenizer
        self.chat_template = ChatTemplate.from_dir(tokenizer.directory) \
            if tokenizer.directory else ChatTemplate(None)
        self.context_limit = context_limit
        self.created = int(time.time())

    def models(self) -> ModelList:
        return ModelList(data=[self.model_card()])

    def model_card(self) -> ModelCard:
        return ModelCard(id=self.config.model_name, created=self.created,
                         max_model_len=self.context_limit)

    def check_model(self, model: str) -> None:
        if model != self.config.model_name:
            raise ModelNotFound(model)

    def completion_job(self, req: CompletionRequest, prompt: str | list[int] | None = None
                       ) -> tuple[GenerationJob, str]:
        """The job and the prompt text (for `echo`) of `prompt` (default: the request's only
        prompt). Tokenizes: call it off the event loop."""
        self.check_model(req.model)
        prompt = req.prompts[0] if prompt is None else prompt
        if isinstance(prompt, str):
            ids, text = self.tokenizer.encode(prompt), prompt
        else:
            ids = [int(t) for t in prompt]
            bad = [t for t in ids if not 0 <= t < self.tokenizer.vocab_size]
            if bad:
                raise BadRequest(f"token id {bad[0]} outside the vocabulary "
                                     f"[0, {self.tokenizer.vocab_size})", param="prompt")
            text = self.tokenizer.decode(ids)
        return self._job(req, ids, prompt_param="prompt"), text

    def chat_job(self, req: ChatCompletionRequest) -> GenerationJob:
        self.check_model(req.model)
        try:
            text = self.chat_template.render(
                [m.template_dict() for m in req.messages], tools=req.tools,
                add_generation_prompt=req.add_generation_prompt,
                extra=req.chat_template_kwargs)
        except TemplateError as exc:
            raise BadRequest(str(exc), param="messages") from exc
        return self._job(req, self.tokenizer.encode(text), prompt_param="messages")

    def _job(self, req: CompletionRequest | ChatCompletionRequest, ids: list[int],
             prompt_param: str) -> GenerationJob:
        cfg = self.config
        if not ids:
            if self.tokenizer.eos_id is None:
                raise BadRequest("the prompt must not be empty", param=prompt_param)
            ids = [self.tokenizer.eos_id]
        max_tokens = cfg.default_max_tokens if req.max_tokens is None else req.max_tokens
        if max_tokens > cfg.max_tokens_limit:
            raise BadRequest(f"max_tokens is {max_tokens}, this daemon allows at most "
                                 f"{cfg.max_tokens_limit}", param="max_tokens")
        if len(ids) > cfg.max_prompt_tokens:
            raise ContextLengthExceeded(f"the prompt has {len(ids)} tokens, this daemon accepts "
                                        f"at most {cfg.max_prompt_tokens}", param=prompt_param)
        if len(ids) + max_tokens > self.context_limit:
            raise ContextLengthExceeded(
                f"this model's context holds {self.context_limit} tokens; the prompt has {len(ids)} "
                f"and max_tokens asks for {max_tokens} more", param="max_tokens")
        seed = req.seed if req.seed is not None else random.SystemRandom().randrange(2**31)
        # top_k at or above the vocabulary keeps every token: the same as off (0), which is what
        # the verifier accepts.
        top_k = req.top_k if req.top_k < self.tokenizer.vocab_size else 0
        sampling = SamplingParams(temperature=req.temperature, top_k=top_k, top_p=req.top_p, seed=seed)
        # ignore_eos: generation does not stop at the tokenizer's end of text.
        stop_ids = frozenset() if req.ignore_eos else self.tokenizer.stop_ids
        request = GenerationRequest(prompt_ids=ids, max_tokens=max_tokens, sampling=sampling,
                                    stop_ids=stop_ids, **req.model_dump(include=set(OPTIONS)))
        return GenerationJob(request, stop_strings=tuple(req.stop_strings), trace=req.tandem_trace)
