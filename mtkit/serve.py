"""`mtkit serve`: an HTTP translation service with dynamic batching (FastAPI + uvicorn,
`pip install 'mtkit[serve]'`).

    POST /v1/translate  {"text": [...], "beam"?, "nbest"?, "alignments"?}
    GET  /v1/health     liveness, and whether the model is loaded
    GET  /v1/info       languages, model size, decoding defaults, the checkpoint's step
    GET  /              a page: translate text and see each sentence's word alignment
    GET  /docs          the OpenAPI documentation

Every request's sentences go into one queue. One model worker thread (`Batcher`) takes
sentences from it, up to `max_batch_tokens` source tokens or until `max_wait_ms` has
passed since the oldest waiting one arrived (or since the last round ended, if later,
so that the clients it answered can join), translates them in one batched search per decoding
setting, and answers each request once its own sentences are done. The event loop only
parses and answers; it never runs the model, so a slow client never holds up others.
"""

from __future__ import annotations

import asyncio
import hmac
import json
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

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mtkit.hypothesis import Hypothesis, pharaoh
from mtkit.translate import DecodeOptions, Frontend

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


class ServeError(Exception):
    """An error answered as JSON {"error": message, "field"?: name} with `status`."""

    def __init__(self, status: int, message: str, field_name: str | None = None):
        super().__init__(message)
        self.status, self.field = status, field_name


# --- the model worker ------------------------------------------------------------------


@dataclass
class _Job:
    """One request's sentences, waiting in the queue."""

    lines: list[str]
    opts: DecodeOptions
    tokens: int  # source tokens, for the batch budget
    future: Future = field(default_factory=Future)
    arrived: float = field(default_factory=time.monotonic)


class Batcher:
    """The queue and the one worker that runs the model (dynamic batching): `run` in the
    calling thread, or `start` a thread for it.

    `mtkit serve` runs the model on the main thread (and HTTP on another): the same
    search ran 1.2-1.5x slower in a second thread on the 2-core machine measured."""

    def __init__(self, translator: Frontend, limits: Limits):
        self.translator, self.limits = translator, limits
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._queued_lines = 0
        self._lock = threading.Lock()
        self._held: _Job | None = None  # taken from the queue, left for the next batch
        self._round_end = 0.0  # time.monotonic() when the last round was answered
        self._thread: threading.Thread | None = None

    def start(self) -> Batcher:
        self._thread = threading.Thread(target=self.run, name="mtkit-model", daemon=True)
        self._thread.start()
        return self

    def submit(self, lines: list[str], opts: DecodeOptions) -> Future:
        """Queue a request's sentences; the future gets one hypothesis list per line."""
        tokens = sum(len(x) + 1 for x in self.translator.encode(lines))
        with self._lock:
            if self._queued_lines + len(lines) > self.limits.max_queued_lines:
                raise ServeError(503, "the server is busy: too many sentences are waiting; "
                                      "retry shortly")
            self._queued_lines += len(lines)
        job = _Job(lines, opts, tokens)
        self._queue.put(job)
        return job.future

    def stop(self) -> None:
        """Let the worker translate what is queued, then return from `run`."""
        self._queue.put(None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _next_batch(self) -> list[_Job] | None:
        """Jobs for one round: the oldest waiting, then others until the token budget is
        spent or the oldest has waited `max_wait_ms`. None once closed and drained."""
        first = self._held or self._queue.get()
        self._held = None
        if first is None:
            return None
        jobs, tokens = [first], first.tokens
        # The wait counts from the oldest sentence's arrival, or from the end of the last
        # round if later: the clients it just answered can then join this round with
        # their next requests, instead of forming a half-empty round of their own.
        deadline = max(first.arrived, self._round_end) + self.limits.max_wait_ms / 1000
        while tokens < self.limits.max_batch_tokens:
            wait = deadline - time.monotonic()
            try:  # past the deadline, still take what is already queued
                job = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None or tokens + job.tokens > self.limits.max_batch_tokens:
                self._held = job  # the stop signal or an overflowing job waits its turn
                break
            jobs.append(job)
            tokens += job.tokens
        return jobs

    def run(self) -> None:
        """Translate queued sentences until `stop`."""
        while (jobs := self._next_batch()) is not None:
            with self._lock:
                self._queued_lines -= sum(len(j.lines) for j in jobs)
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
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ServeError(422, f"the body is not UTF-8 (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ServeError(422, f"the body is not JSON: {e.msg} at character {e.pos}") from None
    try:
        return TranslateRequest.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        name = ".".join(str(x) for x in first["loc"]) or None
        raise ServeError(422, f"{name or 'body'}: {first['msg']}", name) from None


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
        body = parse_request(await request.body())
        if len(body.text) > limits.max_lines:
            raise ServeError(413, f"at most {limits.max_lines} sentences per request, "
                                  f"got {len(body.text)}", "text")
        chars = sum(len(x) for x in body.text)
        if chars > limits.max_chars:
            raise ServeError(413, f"at most {limits.max_chars} characters per request, "
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
        hyps = await asyncio.wrap_future(running.submit(lines, opts)) if lines else []
        return {"translations": [_entry(h, translator, opts) for h in hyps],
                "model": model_name, "elapsed_ms": round(1000 * (time.perf_counter() - start),
                                                         1)}

    @app.get("/v1/health")
    async def health() -> dict:
        """Liveness; `model_loaded` once the model worker runs."""
        return {"status": "ok", "model_loaded": running is not None}

    @app.get("/v1/info")
    async def info() -> dict:
        """What is served: languages, model size, decoding defaults, limits."""
        cfg = translator.config
        return {"model": model_name, "source_language": cfg.data.src_lang,
                "target_language": cfg.data.tgt_lang, "step": step,
                **translator.describe(), "device": str(translator.device),
                "decoding": {k: v for k, v in asdict(defaults).items()
                             if k not in ("format", "scores", "nbest", "alignments")},
                "limits": asdict(limits)}

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
