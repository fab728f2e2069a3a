"""`mtkit serve`: an HTTP translation service with dynamic batching (FastAPI + uvicorn,
`pip install 'mtkit[serve]'`).

    POST /v1/translate  {"text": [...], "beam"?, "nbest"?, "alignments"?}
    GET  /v1/health     liveness, and whether the model is loaded
    GET  /v1/info       languages, model size, decoding defaults, the checkpoint's step
    GET  /              a page: translate text and see each sentence's word alignment
    GET  /docs          the OpenAPI documentation

Every request's sentences go into one queue, and one model worker thread (`Batcher`) runs
the model. Greedy requests join one running greedy search between any two of its steps
and leave it as each sentence ends (continuous batching, `search.GreedyStream`); each
request is answered once its own last sentence ends. Other requests run in rounds: the
worker takes sentences up to `max_batch_tokens` source tokens or until `max_wait_ms` has
passed since the oldest waiting one arrived (or since answers last went out, if later,
so that the clients it answered can join), translates them in one batched search per
decoding setting, and answers each request at the round's end. The event loop only
parses and answers; it never runs the model, so a slow client never holds up others.
At shutdown (`Batcher.close`) what is in flight is finished, one last round takes the
waiting requests up to the budget, and the rest get 503 (`Batcher._finish`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import queue
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect

from mtkit.errors import plural
from mtkit.hypothesis import Hypothesis, pharaoh
from mtkit.translate import DecodeOptions, Frontend, lone_surrogate, read_json

if TYPE_CHECKING:
    from mtkit.native import LineStream

log = logging.getLogger(__name__)
PAGE = Path(__file__).with_name("serve_page.html")


@dataclass(frozen=True)
class Limits:
    max_batch_tokens: int = 4000  # source tokens the worker takes into one search
    max_wait_ms: float = 5.0  # how long the oldest waiting sentence may wait for company
    max_lines: int = 64  # sentences per request
    max_chars: int = 20_000  # characters per request, all sentences together
    max_body_bytes: int = 1 << 20  # request body
    max_queued_lines: int = 20_000  # sentences waiting; beyond this requests get 503


# When waiting greedy requests join the running stream (`Batcher._join_stream`): each
# join runs the encoder, which costs nearly as much for a few sentences as for dozens, so
# they wait until they are half as many as those decoding, or for 3 steps. In-process at
# 32 clients (serve_load's requests, 2-core AMD EPYC, an earlier version of the stream)
# this served 0.66-0.73 of offline throughput, joining at every step 0.62-0.64; at 8
# clients the two did not differ beyond noise.
JOIN_SHARE = 0.5
JOIN_AFTER_STEPS = 3


SHUTTING_DOWN = "the server is shutting down; retry shortly"
DISCONNECT_POLL_S = 0.25  # how often a waiting request checks that its client is still there


class ServeError(Exception):
    """An error answered as JSON {"error": message, "field"?: name} with `status`."""

    def __init__(self, status: int, message: str, field_name: str | None = None):
        super().__init__(message)
        self.status, self.field = status, field_name


# --- the model worker ------------------------------------------------------------------


@dataclass
class _Job:
    """One request's sentences, from the queue until answered."""

    lines: list[str]
    opts: DecodeOptions
    tokens: int  # source tokens, for the batch budget
    longest: int  # tokens of its longest sentence
    future: Future = field(default_factory=Future)
    arrived: float = field(default_factory=time.monotonic)
    seen_at_step: int = 0  # the stream's step count when the worker took the request
    results: list[list[Hypothesis] | None] = field(default_factory=list)  # streamed lines
    left: int = 0  # streamed lines not yet ended


class Batcher:
    """The queue and the one worker that runs the model (dynamic batching): `run` in the
    calling thread, or `start` a thread for it.

    With `continuous` (the default) greedy requests, where the translator can stream
    them (`Frontend.stream`), join one
    running search between any two of its steps and leave it as each sentence ends:
    continuous batching. A request is answered once its last sentence ends. Other
    requests run in rounds: the waiting ones up to the token budget, in one search per
    decoding setting, answered at the round's end.

    `mtkit serve` runs the model on the main thread (and HTTP on another): the same
    search ran 1.2-1.5x slower in a second thread on the 2-core machine measured."""

    def __init__(self, translator: Frontend, limits: Limits, continuous: bool = True):
        self.translator, self.limits, self.continuous = translator, limits, continuous
        self._queue: queue.Queue[_Job | None] = queue.Queue()  # None: stop
        self._queued_lines = 0
        self.received = 0  # requests accepted since start (never falls: a client can wait on it)
        self._stopping = False  # `close` was called: new requests get 503
        self._lock = threading.Lock()
        self._backlog: list[_Job] = []  # taken from the queue, not yet run or streaming
        self._stream: LineStream | None = None
        self._streaming: list[_Job] = []  # requests with sentences in the stream
        self._closing = False
        self._steps = 0  # steps the stream has run
        self._round_end = 0.0  # time.monotonic() when answers last went out
        self._thread: threading.Thread | None = None

    def start(self) -> Batcher:
        self._thread = threading.Thread(target=self.run, name="mtkit-model", daemon=True)
        self._thread.start()
        return self

    def submit(self, lines: list[str], opts: DecodeOptions) -> Future:
        """Queue a request's sentences; the future gets one hypothesis list per line."""
        lengths = [len(x) + 1 for x in self.translator.encode(lines)]
        with self._lock:
            if self._stopping:
                raise ServeError(503, SHUTTING_DOWN)
            if self._queued_lines + len(lines) > self.limits.max_queued_lines:
                raise ServeError(503, "the server is busy: too many sentences are waiting; "
                                      "retry shortly")
            self._queued_lines += len(lines)
            self.received += 1
        job = _Job(lines, opts, sum(lengths), max(lengths, default=0))
        self._queue.put(job)
        return job.future

    @property
    def waiting_lines(self) -> int:
        """Sentences accepted and not yet taken into a round or the stream."""
        return self._queued_lines

    def close(self) -> None:
        """Stop taking requests (new ones get 503) and let `run` finish what it has (see
        `_finish`), then return. Returns at once; safe to call more than once."""
        with self._lock:
            self._stopping = True
        self._queue.put(None)

    def stop(self) -> None:
        """`close`, and wait until the worker thread (if `start`ed) has returned."""
        self.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def run(self) -> None:
        """Translate queued sentences until `close`."""
        while not self._closing:
            self._take(wait=not (self._backlog or self._streaming))
            self._run_round()
            self._join_stream()
            self._step_stream()
        self._finish()

    def _finish(self) -> None:
        """What shutdown promises: the requests in flight are finished, and the waiting
        ones join one last round or the stream, up to the token budget, without waiting
        for company; the rest are answered 503 at once. So a long backlog costs a round
        at shutdown, not the time to translate all of it."""
        self._run_round()
        self._join_stream(eager=True)
        while self._streaming:
            self._step_stream()
        refused = self._taken(list(self._backlog))
        for job in refused:
            job.future.set_exception(ServeError(503, SHUTTING_DOWN))

    def _take(self, wait: bool) -> None:
        """Move queued requests to the backlog. With `wait`, block for the first, then
        wait for company until the token budget is reached or `max_wait_ms` has passed.

        The wait counts from the first request's arrival, or from when answers last went
        out if later: the clients just answered can then join it with their next
        requests, instead of forming a half-empty round of their own."""
        tokens, deadline = 0, None
        while not self._closing:
            wait = wait and not self._stopping  # closing: take all that is queued, now
            if wait and deadline is None:
                job = self._queue.get()
            else:
                timeout = deadline - time.monotonic() if wait else 0
                try:  # past the deadline, still take what is already queued
                    job = (self._queue.get(timeout=timeout) if timeout > 0
                           else self._queue.get_nowait())
                except queue.Empty:
                    return
            if job is None:
                self._closing = True
                return
            job.seen_at_step = self._steps
            self._backlog.append(job)
            tokens += job.tokens
            if deadline is None:
                deadline = max(job.arrived, self._round_end) + self.limits.max_wait_ms / 1000
            if wait and tokens >= self.limits.max_batch_tokens:
                return

    def _streams(self, job: _Job) -> bool:
        """Whether the job goes to the stream (made here for the first that can)."""
        if not self.continuous:
            return False
        if self._stream is not None and self._stream.accepts(job.opts):
            return True
        if self._streaming:  # the running stream decodes with other settings
            return False
        stream = self.translator.stream(job.opts)
        if stream is not None:
            self._stream = stream
        return stream is not None

    def _taken(self, jobs: list[_Job]) -> list[_Job]:
        """Take `jobs` out of the backlog; returns those still awaited (a request whose
        future was cancelled, as uvicorn's shutdown timeout cancels waiting handlers, is
        dropped untranslated; the others' futures can no longer be cancelled, so
        answering them never fails with InvalidStateError)."""
        taken = {id(j) for j in jobs}
        self._backlog = [j for j in self._backlog if id(j) not in taken]
        with self._lock:
            self._queued_lines -= sum(len(j.lines) for j in jobs)
        return [j for j in jobs if j.future.set_running_or_notify_cancel()]

    def _run_round(self) -> None:
        """The backlog's requests that do not stream, oldest first, up to the budget."""
        jobs, tokens = [], 0
        for job in self._backlog:
            if not self._streams(job) and (not jobs or tokens + job.tokens
                                           <= self.limits.max_batch_tokens):
                jobs.append(job)
                tokens += job.tokens
        jobs = self._taken(jobs)
        if not jobs:
            return
        groups: dict[DecodeOptions, list[_Job]] = {}
        for job in jobs:
            groups.setdefault(job.opts, []).append(job)
        for opts, group in groups.items():
            self._translate(group, opts)
        self._round_end = time.monotonic()

    def _translate(self, jobs: list[_Job], opts: DecodeOptions) -> None:
        lines = [line for job in jobs for line in job.lines]
        try:
            hyps = self.translator.translate(lines, opts)
        except Exception as e:  # answer every waiting request, keep serving
            log.exception("translation failed")
            for job in jobs:
                job.future.set_exception(e)
            return
        start = 0
        for job in jobs:
            job.future.set_result(hyps[start : start + len(job.lines)])
            start += len(job.lines)

    def _join_stream(self, eager: bool = False) -> None:
        """Waiting greedy requests join the stream, up to the token budget, when that is
        worth an encoder run (or at once, `eager`): once they are at least `JOIN_SHARE`
        of the sentences decoding, or the oldest has waited `JOIN_AFTER_STEPS` steps."""
        waiting = [j for j in self._backlog if self._streams(j)]
        if not waiting:
            return
        if self._streaming and not eager:
            lines = sum(len(j.lines) for j in waiting)
            if (lines < JOIN_SHARE * len(self._stream)
                    and self._steps - waiting[0].seen_at_step < JOIN_AFTER_STEPS):
                return
        # The budget counts padding, as `translate --batch-tokens` does: the slots'
        # caches are as wide as the longest sentence in them.
        rows = sum(len(j.lines) for j in self._streaming)
        longest = max((j.longest for j in self._streaming), default=0)
        joining = []
        for job in waiting:
            rows, longest = rows + len(job.lines), max(longest, job.longest)
            if (self._streaming or joining) and rows * longest > self.limits.max_batch_tokens:
                break
            joining.append(job)
        if not joining:
            return
        for job in self._taken(joining):
            job.results, job.left = [None] * len(job.lines), len(job.lines)
            try:
                self._stream.add(job.lines, [(id(job), i) for i in range(len(job.lines))],
                                 job.opts)
            except Exception as e:  # the request at fault is answered with the error
                log.exception("translation failed")
                job.future.set_exception(e)
                continue
            self._streaming.append(job)

    def _step_stream(self) -> None:
        """One step of the stream; requests whose last sentence ended are answered."""
        if not self._streaming:
            return
        try:
            ended = self._stream.step()
        except Exception as e:
            self._fail_stream(e)
            return
        self._steps += 1
        if not ended:
            return
        jobs = {id(j): j for j in self._streaming}
        for (job_id, i), hyps in ended:
            job = jobs[job_id]
            job.results[i] = hyps
            job.left -= 1
            if not job.left:
                job.future.set_result(job.results)
        self._streaming = [j for j in self._streaming if j.left]
        self._round_end = time.monotonic()

    def _fail_stream(self, e: Exception) -> None:
        """Answer every request in the stream with the error; start a new stream."""
        log.exception("translation failed")
        for job in self._streaming:
            job.future.set_exception(e)
        self._streaming, self._stream = [], None


# --- the HTTP API ----------------------------------------------------------------------


class TranslateRequest(BaseModel):
    """The body of POST /v1/translate."""

    model_config = ConfigDict(extra="forbid", strict=True)
    text: list[str] = Field(description="Sentences to translate; empty strings stay empty.")
    beam: int | None = Field(None, ge=1, le=64, description="Beam size.")
    nbest: int | None = Field(None, ge=1, le=64, description="Hypotheses per sentence.")
    alignments: bool = Field(False, description="Add Pharaoh word alignments.")


def parse_request(raw: bytes) -> TranslateRequest:
    """The request body as a `TranslateRequest` (JSON, whatever the Content-Type), or a
    422 `ServeError` that names the field at fault."""
    if not raw.strip():
        raise ServeError(422, 'the body is empty: send {"text": ["..."]}')
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ServeError(422, f"the body is not UTF-8 (byte {e.start})") from None
    try:
        data = read_json(text)
    except ValueError as e:
        raise ServeError(422, f"the body is not JSON: {e}") from None
    for key in data if isinstance(data, dict) else ():
        bad = lone_surrogate(key)
        if bad:
            raise ServeError(422, f"body: a field name holds {bad}; the fields are "
                                  f"{', '.join(TranslateRequest.model_fields)}")
    try:
        body = TranslateRequest.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        name = ".".join(str(x) for x in first["loc"]) or None
        message = f"{name or 'body'}: {first['msg']}"
        raise ServeError(422, message.encode("utf-8", "backslashreplace").decode(), name
                         ) from None
    for i, sentence in enumerate(body.text):
        bad = lone_surrogate(sentence)  # an escape such as \ud800 that is no character
        if bad:
            raise ServeError(422, f"text.{i}: {bad}", f"text.{i}")
    return body


def _error(status: int, message: str, field_name: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": message, **({"field": field_name} if field_name else {})}
    return JSONResponse(body, status_code=status, headers=headers)


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes gets 413 before it is read
    (by its Content-Length) or while it is read (a chunked body)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers", [])).get(b"content-length", b"0")
        too_large = _error(413, f"the request body is over {self.limit} bytes")
        if not length.isdigit() or int(length) > self.limit:
            return await too_large(scope, receive, send)
        seen, started = 0, False

        async def counted_receive():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge
            return message

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except _TooLarge:
            if not started:
                await too_large(scope, receive, send)


class _TooLarge(Exception):
    pass


async def _awaited(request: Request, future: Future) -> list | None:
    """The future's result, or None when the client disconnects first: then the future
    is cancelled, and the worker drops the request if its search has not begun."""
    waiting = asyncio.wrap_future(future)
    while not (await asyncio.wait({waiting}, timeout=DISCONNECT_POLL_S))[0]:
        if await request.is_disconnected():
            waiting.cancel()
            return None
    return waiting.result()


def create_app(translator: Frontend, defaults: DecodeOptions, limits: Limits,
               model_name: str, step: int | None = None, api_key: str | None = None,
               batcher: Batcher | None = None) -> FastAPI:
    """The service for one loaded model (or ensemble). `defaults`: the decoding options
    of requests that do not set them. `batcher`: a worker that the caller runs (see
    `serve_forever`); without one, the app starts its own thread."""
    running: Batcher | None = None

    async def lifespan(app: FastAPI):
        nonlocal running
        running = batcher or Batcher(translator, limits).start()
        yield
        await asyncio.to_thread(running.stop)  # in-flight requests are answered first

    app = FastAPI(title="mtkit", summary="Transformer machine translation",
                  lifespan=lifespan)
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes)

    @app.middleware("http")
    async def authorize(request: Request, call_next: Callable[[Request], Awaitable]):
        """With an API key, /v1/* (but /v1/health) needs `Authorization: Bearer KEY`."""
        path = request.url.path
        if api_key and path.startswith("/v1/") and path != "/v1/health":
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, f"Bearer {api_key}".encode()):
                return _error(401, "missing or wrong API key: send 'Authorization: Bearer "
                                   "KEY'", headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)

    @app.exception_handler(ServeError)
    async def refused(request: Request, e: ServeError) -> JSONResponse:
        return _error(e.status, str(e), e.field)

    schema = {"required": True, "content": {"application/json": {
        "schema": TranslateRequest.model_json_schema()}}}

    @app.post("/v1/translate", openapi_extra={"requestBody": schema})
    async def translate(request: Request) -> dict:
        """Translate sentences; the answer keeps their order."""
        try:
            raw = await request.body()
        except ClientDisconnect:  # the client left mid-body: no one to answer or log for
            return Response(status_code=400)
        body = parse_request(raw)
        if len(body.text) > limits.max_lines:
            raise ServeError(413, f"at most {plural(limits.max_lines, 'sentence')} per request, "
                                  f"got {len(body.text)}", "text")
        chars = sum(len(x) for x in body.text)
        if chars > limits.max_chars:
            raise ServeError(413, f"at most {plural(limits.max_chars, 'character')} per "
                                  f"request, "
                                  f"got {chars}", "text")
        if body.alignments and not translator.can_align:
            raise ServeError(422, "alignments need a checkpoint: this server runs an "
                                  "exported CTranslate2 model", "alignments")
        beam = body.beam or defaults.beam
        nbest = body.nbest or 1
        if nbest > beam:
            raise ServeError(422, f"nbest {nbest} must not exceed the beam size {beam}",
                             "nbest")
        opts = replace(defaults, beam=beam, nbest=nbest, alignments=body.alignments,
                       batch_tokens=limits.max_batch_tokens)
        start = time.perf_counter()
        lines = [" ".join(x.split()) for x in body.text]  # a sentence is one line
        hyps = await _awaited(request, running.submit(lines, opts)) if lines else []
        if hyps is None:  # the client left while its request waited: dropped
            return Response(status_code=400)
        return {"translations": [_entry(h, translator, opts) for h in hyps],
                "model": model_name, "elapsed_ms": round(1000 * (time.perf_counter() - start),
                                                         1)}

    @app.get("/v1/health")
    async def health() -> dict:
        """Liveness; `model_loaded` once the model worker runs."""
        return {"status": "ok", "model_loaded": running is not None}

    @app.get("/v1/info")
    async def info() -> dict:
        """What is served: languages, model size, decoding defaults, limits, load."""
        cfg = translator.config
        return {"model": model_name, "source_language": cfg.data.src_lang,
                "target_language": cfg.data.tgt_lang, "step": step,
                **translator.describe(), "device": str(translator.device),
                "decoding": {k: v for k, v in asdict(defaults).items()
                             if k not in ("format", "scores", "nbest", "alignments")},
                "limits": asdict(limits),
                "load": {"requests_received": running.received,
                         "waiting_lines": running.waiting_lines}}

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    return app


def _entry(hyps: list[Hypothesis], translator: Frontend, opts: DecodeOptions) -> dict:
    """One sentence's answer: its best translation, and the n-best list when asked."""

    def one(h: Hypothesis) -> dict:
        return {"text": translator.tgt_vocab.decode(h.tokens), "score": round(h.score, 4),
                **({"alignment": pharaoh(h.alignment or ())} if opts.alignments else {})}

    entry = one(hyps[0])
    if opts.nbest > 1:
        entry["nbest"] = [one(h) for h in hyps]
    return entry


def serve_forever(app: FastAPI, batcher: Batcher, host: str, port: int, ready: str = ""
                  ) -> int | None:
    """Serve `app` (made with `batcher`) until SIGTERM or Ctrl-C; then stop accepting,
    answer what is in flight, and return the signal that stopped it. HTTP runs in a
    thread; the model runs here, on the calling (main) thread. `ready` is logged once the
    port is open."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started and ready:
                log.info("%s", ready)

    server = Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                   access_log=False, timeout_graceful_shutdown=60))
    stopped_by: list[int] = []

    def stop(sig: int, frame) -> None:
        stopped_by.append(sig)
        # The batcher first, so that waiting requests get 503 now and uvicorn's graceful
        # shutdown waits only for the last round; from a thread, as the main thread may
        # hold the lock that `close` takes.
        threading.Thread(target=batcher.close, name="mtkit-close", daemon=True).start()
        server.should_exit = True  # uvicorn's own graceful shutdown

    sock = _listen(host, port)

    def http() -> None:
        try:
            server.run(sockets=[sock])
        finally:  # the app's shutdown stops the batcher; so does a failed start
            batcher.stop()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        thread = threading.Thread(target=http, name="mtkit-http", daemon=True)
        thread.start()
        batcher.run()
        thread.join()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if not server.started:
        raise OSError(f"the server on {host}:{port} did not start")
    return stopped_by[0] if stopped_by else None


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, or a one-line OSError (in use, not allowed, ...)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {(e.strerror or str(e)).lower()}"
                      ) from None
    return sock
