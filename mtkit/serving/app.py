"""The HTTP app of `mtkit serve` (FastAPI + uvicorn, `pip install 'mtkit[serve]'`).

    POST /v1/translate  {"text": [...], "beam"?, "nbest"?, "alignments"?, "constraints"?,
                         "target_lang"?, "lang_vocab"?}
    GET  /v1/health     liveness, and whether the model is loaded
    GET  /v1/ready      readiness: 200 once the model is loaded and warmed up, 503 before
                        and while the server drains (what a load balancer routes by)
    GET  /metrics       the Prometheus text format (`mtkit.serving.metrics`)
    GET  /v1/info       languages, model size, decoding defaults, the checkpoint's step
    GET  /              a page: translate text and see each sentence's word alignment
    GET  /docs          the OpenAPI documentation
    and LibreTranslate's and DeepL's routes (`mtkit.serving.protocols`)
    and their document routes (`mtkit.serving.documents`)

The event loop only parses and answers; the model runs in the worker
(`mtkit.serving.scheduler.Batcher`), so a slow client never holds up others.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException

from mtkit.core.errors import OptionError, UserError, plural
from mtkit.core.hypothesis import pharaoh
from mtkit.core.languages import (
    bilingual_pair,
    directions,
    name,
    target_languages,
)
from mtkit.core.search_options import (
    OPTIONS,
    SearchOptions,
)
from mtkit.core.terms import Glossary
from mtkit.core.textio import lone_surrogate, read_constraints_field, read_json
from mtkit.core.translation import Translation
from mtkit.documents.elements import PLAIN, MarkupRules
from mtkit.engines.base import Engine
from mtkit.engines.session import Session, check_constraint_options
from mtkit.serving.documents import DocumentQueue, add_document_routes, body_limit
from mtkit.serving.metrics import NOT_INSTALLED, Metrics, Recorded, open_metrics
from mtkit.serving.protocols import add_routes, credentials, key_ok, refusal
from mtkit.serving.scheduler import (
    SHUTTING_DOWN,
    Batcher,
    DocumentLimits,
    Limits,
    QueuedEngine,
    ServeError,
    Ticket,
)

log = logging.getLogger(__name__)
PAGE = Path(__file__).with_name("page.html")
DISCONNECT_POLL_S = 0.25  # how often a waiting request checks that its client is still there
DRAIN_BODY_S = 2.0  # how long a body still arriving at shutdown may take before a 503
# Requests whose sessions run at once, each in a thread that mostly waits for the batcher.
# asyncio's default pool has min(32, cores + 4) threads: 6 on two cores, so the batcher
# saw at most 6 requests to batch together and the rest waited unseen, whatever the device.
SESSION_THREADS = 256
CORS_MAX_AGE_S = 86_400  # how long a browser may keep a preflight's answer
GRACEFUL_SHUTDOWN_S = 60  # after a stop signal, the longest the requests in flight may take
WARM_UP_TEXT = "warm up"  # the one short search run at start, before /v1/ready says 200
OPEN_PATHS = ("/v1/health", "/v1/ready")  # probes: open without the API key, as /metrics


class TranslateRequest(BaseModel):
    """The body of POST /v1/translate."""

    model_config = ConfigDict(extra="forbid", strict=True)
    text: list[str] = Field(description="Sentences to translate; empty strings stay empty.")
    # Ranges are the options' own (`mtkit.core.search_options.OPTIONS`), checked with the
    # CLI's checks.
    beam: int | None = Field(None, description=OPTIONS["beam"].help)
    nbest: int | None = Field(None, description="Hypotheses per sentence (at most the beam).")
    alignments: bool = Field(False, description=OPTIONS["alignments"].help)
    constraints: list[list[str | list[str]]] | None = Field(
        None,
        description="Per sentence, the target phrases its translation must contain: "
        "each item a phrase, or a list of alternative phrases (any one of them).",
    )
    target_lang: str | None = Field(
        None,
        description="The language to translate into: needed by a multilingual model "
        "(/v1/info lists its target_languages), optional for a bilingual one.",
    )
    lang_vocab: bool | None = Field(
        None,
        description=OPTIONS["lang_vocab"].help.replace("--no-lang-vocab", "false")
        + " Default: the server's.",
    )
    split: bool | None = Field(
        None,
        description="Translate a text of several sentences sentence by sentence and join "
        "them back (each answer then lists its sentences). Default: the model's "
        "decode.split.",
    )


def parse_body(raw: bytes) -> TranslateRequest:
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
            raise ServeError(
                422,
                f"body: a field name holds {bad}; the fields are "
                f"{', '.join(TranslateRequest.model_fields)}",
            )
    try:
        body = TranslateRequest.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        name = ".".join(str(x) for x in first["loc"]) or None
        message = f"{name or 'body'}: {first['msg']}"
        raise ServeError(422, message.encode("utf-8", "backslashreplace").decode(), name) from None
    for i, sentence in enumerate(body.text):
        bad = lone_surrogate(sentence)  # an escape such as \ud800 that is no character
        if bad:
            raise ServeError(422, f"text.{i}: {bad}", f"text.{i}")
    if body.constraints is not None and len(body.constraints) != len(body.text):
        raise ServeError(
            422,
            f"constraints: one list per sentence: "
            f"{plural(len(body.text), 'sentence')}, "
            f"{plural(len(body.constraints), 'list')}",
            "constraints",
        )
    for i, items in enumerate(body.constraints or ()):
        try:
            read_constraints_field(items)
        except ValueError as e:
            raise ServeError(422, f"constraints.{i}: {e}", f"constraints.{i}") from None
    return body


def _error(
    status: int, message: str, field_name: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = {"error": message, **({"field": field_name} if field_name else {})}
    return JSONResponse(body, status_code=status, headers=headers)


class BodyReader:
    """ASGI middleware: a request's body is read whole before any route sees it, so that
    every way a body can fail to arrive is answered here, once for every route and every
    kind of body (JSON, a form), in the shape of the API asked (`refusal`):

    - over `limits.max_body_bytes`: 413, by its Content-Length before it is read, or
      while a chunked one is read;
    - not all there `limits.body_timeout_s` after the request began: 408 (a client that
      trickles its body holds its connection no longer);
    - still arriving while the server shuts down (`draining`): DRAIN_BODY_S more at
      most, then 503, so that shutdown waits for no slow client;
    - the client leaves mid-body: no one to answer, and nothing to log.

    A refusal before the body is whole closes the connection (what is left of the body
    would be read as the next request). Routes then read the body from memory:
    `request.body()` never raises ClientDisconnect."""

    def __init__(self, app, limits: Limits, draining: Callable[[], bool]):
        self.app, self.limits, self.draining = app, limits, draining

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            body = await self._read(scope, receive)
        except _Unread as e:
            close = {"Connection": "close"}
            return await refusal(scope["path"], e.status, str(e), close)(scope, receive, send)
        except _ClientLeft:
            return None
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:  # the body was read: what comes now is the client leaving
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, scope, receive) -> bytes:
        """The request's body; `_Unread` (a status and why) or `_ClientLeft`."""
        limit = body_limit(scope["path"], self.limits)
        length = dict(scope.get("headers", [])).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > limit:
            raise _Unread(413, f"the request body is over {limit} bytes")
        deadline = time.monotonic() + self.limits.body_timeout_s
        chunks: list[bytes] = []
        seen = 0
        while True:
            arriving = asyncio.ensure_future(receive())
            try:  # waited for in slices: shutdown may bring the deadline nearer
                while True:
                    if self.draining():
                        deadline = min(deadline, time.monotonic() + DRAIN_BODY_S)
                    left = deadline - time.monotonic()
                    if left <= 0:  # (a trickled body is late however often its bytes come)
                        raise self._late()
                    if (await asyncio.wait({arriving}, timeout=min(left, DISCONNECT_POLL_S)))[0]:
                        break
            finally:
                arriving.cancel()  # (a no-op once it is done)
            message = arriving.result()
            if message["type"] == "http.disconnect":
                raise _ClientLeft
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > limit:
                raise _Unread(413, f"the request body is over {limit} bytes")
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _late(self) -> _Unread:
        if self.draining():
            return _Unread(503, SHUTTING_DOWN)
        seconds = f"{self.limits.body_timeout_s:g}"
        return _Unread(408, f"the request body did not arrive within {seconds} s (--body-timeout)")


class _Unread(Exception):
    """A body refused before it was read whole: its status, and why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class _ClientLeft(Exception):
    pass


class Answered:
    """ASGI middleware: whatever fails inside a route is answered in the shape of the API
    asked (`refusal`), never with a bare "Internal Server Error": an unexpected exception
    is a bug, logged once with its traceback and answered 500. (A mistake in the request,
    a `UserError`, is a 4xx: `_guard`'s handlers.)"""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except Exception:
            if started:  # too late to answer: the server logs it and closes the connection
                raise
            log.exception("%s %s failed (a bug in mtkit)", scope["method"], scope["path"])
            why = "internal error: the request failed in the server (a bug; its log says more)"
            await refusal(scope["path"], 500, why)(scope, receive, send)


@dataclass
class Service:
    """One loaded model (or ensemble) behind the API: what the routes read.
    `defaults`: the decoding options of requests that do not set them; `step`: what the
    checkpoint's weights are (a training step, or a description such as "the average
    of steps 800-1000"); `batcher`: the worker, once running."""

    translator: Engine
    defaults: SearchOptions
    limits: Limits
    model_name: str
    step: int | str | None = None
    batcher: Batcher | None = None
    glossary: Glossary | None = None  # `serve --glossary`: terms every request gets
    session: Session | None = None  # what each request translates with (`start`)
    documents: DocumentQueue | None = None  # the document routes' jobs
    sessions: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(SESSION_THREADS, "mtkit-session")
    )  # where each request's session runs (`translated`)
    metrics: Metrics | None = None  # None without prometheus-client
    warmed: bool = False  # the warm-up search has run (`warm_up`)
    draining: bool = False  # a stop signal came: /v1/ready says 503 (`serve_forever`)

    def unready(self) -> str | None:
        """Why /v1/ready says 503, or None when the server takes traffic."""
        if self.draining or _draining(self):
            return SHUTTING_DOWN
        if not self.warmed:
            return "not ready: the model is loading and warming up; retry shortly"
        return None

    def warm_up(self) -> None:
        """One short search through the batcher, as a request's, so that the first
        clients do not pay for the first run's allocations; then the server is ready. A
        search that fails is logged and leaves the server unready (it would fail every
        request too); a shutdown meanwhile only ends it."""
        start = time.perf_counter()
        opts = replace(self.defaults, nbest=1, alignments=False)
        try:
            self.batcher.submit([WARM_UP_TEXT], opts, counted=False).result()
        except ServeError:  # the server is shutting down
            return
        except Exception:
            log.exception("the warm-up search failed: /v1/ready stays 503")
            return
        if self.metrics:
            self.metrics.warmup_seconds.set(time.perf_counter() - start)
        self.warmed = True

    def options(self, body: TranslateRequest) -> SearchOptions:
        """A request's search options: the defaults with its own beam, n-best,
        alignments and output vocabulary (`lang_vocab`), checked as the command line
        checks them (422 naming the field)."""
        try:
            opts = SearchOptions.from_config(
                self.defaults,
                spell=str,
                beam=body.beam,
                nbest=1 if body.nbest is None else body.nbest,
                alignments=body.alignments or None,
                lang_vocab=body.lang_vocab,
            )
            self.translator.check(opts, spell=str)
        except OptionError as e:
            raise ServeError(422, str(e), e.option) from None
        return opts

    def options_for(self, nbest: int) -> SearchOptions:
        """The defaults with `nbest` hypotheses per sentence (the beam widened to hold
        them), as the protocol routes ask for alternatives."""
        opts = replace(self.defaults, beam=max(self.defaults.beam, nbest), nbest=nbest)
        self.translator.check(opts, spell=str)
        return opts

    def constraints(self, body: TranslateRequest, opts: SearchOptions):
        """The request's own constraints, one list per text (None if it has none), where
        `opts` can search for them (422 naming the field), and options that cannot search
        with the server's glossary (a beam of 1) refused, as `translate --glossary`
        refuses them, in every request whether or not its texts hold a term. Each text's
        own constraints are checked by the session, which names it "constraints.N"; the
        glossary's terms are the session's to add, sentence by sentence
        (`mtkit.engines.session.searchable`)."""
        if self.glossary:
            glossary = "this server's glossary (serve --glossary)"
            try:
                check_constraint_options(self.translator, opts, [glossary], spell=str)
            except OptionError as e:
                raise ServeError(422, str(e), "beam") from None
        own = [list(read_constraints_field(c)) for c in body.constraints or [[]] * len(body.text)]
        if not any(own):
            return None
        try:
            check_constraint_options(self.translator, opts, ["constraints"], spell=str)
        except OptionError as e:
            raise ServeError(422, str(e), "constraints") from None
        return own

    def start(self, batcher: Batcher) -> None:
        """Serve through `batcher`: the engine every request's session translates with
        (`QueuedEngine`, its searches queued in the batcher) and the session with the
        server's defaults, made once."""
        self.batcher = batcher
        batcher.metrics = self.metrics
        engine = QueuedEngine(self.translator, batcher)
        self.session = Session(
            engine,
            self.defaults,
            self.glossary,
            split=self.translator.config.decode.split,
            batch_tokens=engine.batch_tokens,
            spell=field_name,
            name_line=lambda i: f"constraints.{i}",
        )

    async def translated(
        self,
        request: Request,
        texts: list[str],
        opts: SearchOptions,
        *,
        format: str = "text",
        constraints: list[list[tuple[str, ...]]] | None = None,
        tgt_lang: str | None = None,
        split: bool | None = None,
        markup: MarkupRules = PLAIN,
    ) -> list[Translation] | None:
        """`texts` translated by the server's session (`Session.translate_texts`:
        sentences split and joined, markup carried through, the server's glossary) with
        this request's options, language, split and markup rules, in a thread of `sessions`, its
        searches queued in the batcher under the request's `Ticket`; None when the client
        disconnects first (its searches not yet begun are dropped). A mistake in the
        request is a `UserError`, answered by the app's handler (4xx, naming its field)."""
        session = replace(
            self.session,
            opts=opts,
            tgt_lang=tgt_lang,
            split=self.session.split if split is None else split,
            markup=markup,
        )
        ticket = Ticket()
        work = asyncio.get_running_loop().run_in_executor(
            self.sessions,
            functools.partial(ticket.run, session.translate_texts, texts, format, constraints),
        )
        while not (await asyncio.wait({work}, timeout=DISCONNECT_POLL_S))[0]:
            if await request.is_disconnected():
                ticket.cancel()
                work.add_done_callback(lambda w: w.cancelled() or w.exception())  # heard
                return None
        return work.result()

    def info(self) -> dict:
        """What /v1/info says: languages, engine, decoding defaults, limits, load."""
        cfg = self.translator.config
        pairs = directions(cfg.data) or [bilingual_pair(cfg.data)]
        return {
            "model": self.model_name,
            # the model's own, not the data section's defaults: a multilingual
            # model's several, comma-separated (`target_languages` lists them)
            "source_language": ", ".join(sorted({src for src, _ in pairs})),
            "target_language": ", ".join(sorted({tgt for _, tgt in pairs})),
            "step": self.step,
            "directions": [name(d) for d in directions(cfg.data)],
            "target_languages": target_languages(cfg.data),  # [] for a bilingual model
            "weights": " + ".join(self.translator.weights),
            **self.translator.describe(),
            "constraints": self.translator.capabilities.constraints,
            "glossary_terms": len(self.glossary) if self.glossary is not None else 0,
            "decoding": {
                k: v for k, v in asdict(self.defaults).items() if k not in ("nbest", "alignments")
            },
            "limits": asdict(self.limits),
            "load": {
                "requests_received": self.batcher.received,
                "waiting_lines": self.batcher.waiting_lines,
            },
        }


def field_name(option: str) -> str:
    """How an answer names an option: as the /v1 body's field (target_lang)."""
    return "target_lang" if option == "tgt_lang" else option


def create_app(
    translator: Engine,
    defaults: SearchOptions,
    limits: Limits,
    model_name: str,
    step: int | str | None = None,
    api_key: str | None = None,
    batcher: Batcher | None = None,
    glossary: Glossary | None = None,
    cors_origins: Sequence[str] = (),
    load_seconds: float | None = None,
) -> FastAPI:
    """The service for one loaded model (or ensemble). `defaults`: the decoding options
    of requests that do not set them. `batcher`: a worker that the caller runs (see
    `serve_forever`); without one, the app starts its own thread. `glossary`: terms
    whose targets every request's translations must contain. `cors_origins`: the web
    pages' origins whose scripts may call every route ("*": any; none: only the page
    at /, the server's own origin). `load_seconds`: how long the model took to load
    (for /metrics). The app's `state.service` is its `Service`."""
    service = Service(translator, defaults, limits, model_name, step, glossary=glossary)
    service.metrics = open_metrics(
        lambda: service.batcher.waiting_lines if service.batcher else 0,
        lambda: service.unready() is None,
    )
    if service.metrics and load_seconds is not None:
        service.metrics.load_seconds.set(load_seconds)

    async def lifespan(app: FastAPI):
        service.start(batcher or Batcher(translator, limits).start())
        warming = asyncio.get_running_loop().run_in_executor(service.sessions, service.warm_up)
        yield
        service.documents.close()  # queued documents end; running ones as the batcher closes
        await asyncio.to_thread(service.batcher.stop)  # in-flight requests are answered first
        await asyncio.to_thread(service.documents.stop)
        await warming
        service.sessions.shutdown(wait=False)

    app = FastAPI(title="mtkit", summary="Transformer machine translation", lifespan=lifespan)
    _guard(app, api_key)
    # (each added outside the last:) a body is read whole, or refused, before the key is
    # asked for, as LibreTranslate's key may come inside it; and whatever fails in any of
    # it is answered in the API's shape
    app.add_middleware(BodyReader, limits=limits, draining=lambda: _draining(service))
    app.add_middleware(Answered)
    if cors_origins:  # outermost: a preflight is answered before the key is asked for
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
            max_age=CORS_MAX_AGE_S,
        )
    if service.metrics:  # outermost: every answer is counted, refusals too
        app.add_middleware(Recorded, metrics=service.metrics)
    _routes(app, service)
    service.documents = add_document_routes(app, add_routes(app, service, api_key))
    app.state.service = service
    return app


def _draining(service: Service) -> bool:
    """Whether the server is shutting down (its batcher closed)."""
    return service.batcher is not None and service.batcher.stopping


def _guard(app: FastAPI, api_key: str | None) -> None:
    """The API key check and the JSON form of refusals, in the shape of the API asked
    (`refusal`): an unknown path or a method a route does not take too."""

    @app.middleware("http")
    async def authorize(request: Request, call_next: Callable[[Request], Awaitable]):
        """With an API key, /v1/* (but the probes, /v1/health and /v1/ready) needs
        `Authorization: Bearer KEY`."""
        path = request.url.path
        if path.startswith("/v1/") and path not in OPEN_PATHS:
            if not key_ok(credentials(request, ("bearer",)), api_key):
                return _error(
                    401,
                    "missing or wrong API key: send 'Authorization: Bearer KEY'",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return await call_next(request)

    @app.exception_handler(ServeError)
    async def refused(request: Request, e: ServeError) -> JSONResponse:
        return _refused(request.url.path, e)

    @app.exception_handler(UserError)
    async def mistaken(request: Request, e: UserError) -> JSONResponse:
        """A mistake in the request that a route did not turn into a ServeError itself."""
        return _refused(request.url.path, ServeError(422, e.line(), getattr(e, "option", None)))

    @app.exception_handler(HTTPException)
    async def not_routed(request: Request, e: HTTPException) -> JSONResponse:
        return refusal(request.url.path, e.status_code, str(e.detail), e.headers)


def _refused(path: str, e: ServeError) -> JSONResponse:
    """A `ServeError` answered in the shape of the API that `path` is on: /v1's
    {"error", "field"} with its status; LibreTranslate's and DeepL's (`refusal`) with 400
    for 422, which they do not use."""
    if path.startswith("/v1/"):
        return _error(e.status, str(e), e.field)
    return refusal(path, 400 if e.status == 422 else e.status, str(e))


def _routes(app: FastAPI, service: Service) -> None:
    schema = {
        "required": True,
        "content": {"application/json": {"schema": TranslateRequest.model_json_schema()}},
    }

    @app.post("/v1/translate", openapi_extra={"requestBody": schema})
    async def translate(request: Request) -> dict:
        """Translate sentences; the answer keeps their order."""
        body = parse_body(await request.body())  # (read whole by `BodyReader`)
        service.limits.check(body.text)
        opts = service.options(body)
        start = time.perf_counter()
        found = await service.translated(
            request,
            [" ".join(x.split()) for x in body.text],
            opts,
            constraints=service.constraints(body, opts),
            tgt_lang=body.target_lang,
            split=body.split,
        )
        if found is None:  # the client left while its request waited: dropped
            return Response(status_code=400)
        return {
            "translations": [_entry(t, opts) for t in found],
            "model": service.model_name,
            "elapsed_ms": round(1000 * (time.perf_counter() - start), 1),
        }

    @app.get("/v1/health")
    async def health() -> dict:
        """Liveness; `model_loaded` once the model worker runs."""
        return {"status": "ok", "model_loaded": service.batcher is not None}

    @app.get("/v1/ready", responses={503: {"description": "Not ready: warming up or draining"}})
    async def ready() -> dict:
        """Readiness: 200 once the model is loaded and its warm-up search has run; 503
        (in /v1's error shape) before, and from the moment a stop signal comes."""
        why = service.unready()
        if why:
            raise ServeError(503, why)
        return {"status": "ready"}

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        """The Prometheus text format; 501 and what to install without
        prometheus-client."""
        if service.metrics is None:
            return Response(NOT_INSTALLED + "\n", status_code=501, media_type="text/plain")
        body, content_type = service.metrics.scrape()
        return Response(body, media_type=content_type)

    @app.get("/v1/info")
    async def info() -> dict:
        """What is served: languages, model size, decoding defaults, limits, load."""
        return service.info()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))


def _entry(found: Translation, opts: SearchOptions) -> dict:
    """One text's answer: its best translation (with its sentences, where it was split),
    and the n-best list when asked."""

    def one(t: Translation) -> dict:
        return {
            "text": t.text,
            "score": round(t.score, 4),
            "confidence": round(t.confidence, 4),
            **({"alignment": pharaoh(t.alignment or ())} if opts.alignments else {}),
            **({"constraints_met": t.constraints_met} if t.constraints_met is not None else {}),
            **(
                {
                    "sentences": [
                        {
                            "source": s.source,
                            "text": s.text,
                            "score": round(s.score, 4),
                            "confidence": round(s.confidence, 4),
                        }
                        for s in t.sentences
                    ]
                }
                if t.sentences
                else {}
            ),
        }

    entry = one(found)
    if opts.nbest > 1:
        entry["nbest"] = [one(replace(found, alternatives=()))] + [
            one(a) for a in found.alternatives
        ]
    return entry


MAX_WAIT_MS = 60_000  # serve --max-wait-ms: a minute is already far past any batching gain
MAX_BODY_TIMEOUT_S = 3_600  # serve --body-timeout: an hour for 1 MB is a client that stalled


def checked_limits(
    port: int,
    max_batch_tokens: int | None,
    max_wait_ms: float,
    max_lines: int,
    max_chars: int,
    body_timeout: float = Limits.body_timeout_s,
    documents: DocumentLimits = DocumentLimits(),
):
    """The server's limits, each checked as `serve`'s options (max_batch_tokens None: 0,
    the engine's); `documents`: the document routes' (`checked_document_limits`)."""
    if not 1 <= port <= 65535:
        raise OptionError(f"--port must be from 1 to 65535, got {port}")
    if not 0 <= max_wait_ms <= MAX_WAIT_MS:  # nan fails too
        raise OptionError(f"--max-wait-ms must be from 0 to {MAX_WAIT_MS:,}, got {max_wait_ms}")
    if not 0 < body_timeout <= MAX_BODY_TIMEOUT_S:  # nan fails too
        raise OptionError(
            f"--body-timeout must be above 0 and at most {MAX_BODY_TIMEOUT_S:,}, got {body_timeout}"
        )
    for option, value in (
        ("max_batch_tokens", max_batch_tokens),
        ("max_lines", max_lines),
        ("max_chars", max_chars),
    ):
        if value is not None and value <= 0:
            raise OptionError(f"--{option.replace('_', '-')} must be above 0, got {value}")
    return Limits(
        max_batch_tokens or 0,
        max_wait_ms,
        max_lines,
        max_chars,
        body_timeout_s=body_timeout,
        documents=documents,
    )


MAX_DOCUMENT_BYTES = 1 << 30  # serve --document-max-bytes: an upload is held in memory
MAX_DOCUMENT_WORKERS = 64  # serve --document-workers: threads that mostly wait on the batcher
MAX_DOCUMENT_EXPIRY_S = 7 * 24 * 3600  # serve --document-expiry: a result held a week at most


def checked_document_limits(
    max_bytes: int | None = None,
    max_chars: int | None = None,
    max_jobs: int | None = None,
    workers: int | None = None,
    expiry: float | None = None,
) -> DocumentLimits:
    """The document routes' limits (`DocumentLimits`), each checked as `serve`'s
    --document-* option; None: the default."""
    given = dict(
        max_bytes=_in_range("--document-max-bytes", max_bytes, 1, MAX_DOCUMENT_BYTES),
        max_chars=_in_range("--document-max-chars", max_chars, 1),
        max_jobs=_in_range("--document-max-jobs", max_jobs, 1),
        workers=_in_range("--document-workers", workers, 1, MAX_DOCUMENT_WORKERS),
        expiry_s=_in_range("--document-expiry", expiry, 0, MAX_DOCUMENT_EXPIRY_S),
    )
    return replace(DocumentLimits(), **{k: v for k, v in given.items() if v is not None})


def _in_range(option: str, value: float | None, low: float, high: float | None = None):
    """`value` (None: not given), or one line naming `option` where it is below `low` or
    above `high` (None: no bound), or not a number (nan)."""
    if value is not None and not (low <= value and (high is None or value <= high)):
        most = f" and at most {high:,}" if high is not None else ""
        raise OptionError(f"{option} must be at least {low}{most}, got {value}")
    return value


MAX_DRAIN_DELAY_S = 600  # serve --drain-delay: past ten minutes a balancer is not looking


def checked_drain_delay(seconds: float) -> float:
    """`serve --drain-delay`, checked."""
    if not 0 <= seconds <= MAX_DRAIN_DELAY_S:  # nan fails too
        raise OptionError(f"--drain-delay must be from 0 to {MAX_DRAIN_DELAY_S}, got {seconds}")
    return seconds


def checked_origins(origins: Sequence[str]) -> tuple[str, ...]:
    """`serve --cors-origin`'s origins, each "*" or a scheme and a host (with a port or
    not): what a browser sends in its Origin header, to which it is compared as given."""
    for origin in origins:
        if origin != "*" and not re.fullmatch(r"[a-z][a-z0-9+.-]*://[^/\s]+", origin):
            raise OptionError(
                f"--cors-origin must be '*' or an origin such as https://example.org (a "
                f"scheme and a host, in lower case, with no path), got {origin!r}"
            )
    return tuple(origins)


def run_service(
    engine: Engine,
    defaults: SearchOptions,
    limits,
    model: list,
    host: str,
    port: int,
    continuous: bool,
    api_key: str | None,
    glossary=None,
    cors_origins: Sequence[str] = (),
    load_seconds: float | None = None,
    drain_delay: float = 0.0,
) -> int | None:
    """Serve `engine` (loaded from `model` in `load_seconds`) on host:port until a
    signal; returns the signal. `drain_delay`: see `serve_forever`."""
    if not limits.max_batch_tokens:
        limits = replace(limits, max_batch_tokens=engine.batch_tokens)
    served = " + ".join(m.name for m in model)
    batcher = Batcher(engine, limits, continuous)
    app_ = create_app(
        engine,
        defaults,
        limits,
        served,
        engine.steps[0],
        api_key,
        batcher,
        glossary,
        cors_origins,
        load_seconds,
    )
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    ready = f"serving {served} on {url} (page at /, API docs at /docs)" + (
        "; API key required" if api_key else ""
    )
    return serve_forever(app_, batcher, host, port, ready, drain_delay)


def serve_forever(
    app: FastAPI,
    batcher: Batcher,
    host: str,
    port: int,
    ready: str = "",
    drain_delay: float = 0.0,
) -> int | None:
    """Serve `app` (made with `batcher`) until SIGTERM or Ctrl-C; then stop accepting,
    answer what is in flight, and return the signal that stopped it. HTTP runs in a
    thread; the model runs here, on the calling (main) thread. `ready` is logged once the
    port is open.

    A stop signal first turns /v1/ready to 503; the server then goes on serving for
    `drain_delay` seconds, so that a load balancer's health check sees it is leaving
    and sends it nothing new before its port closes (a second signal ends the wait)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started and ready:
                log.info("%s", ready)

    server = Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
    )
    stopped_by: list[int] = []

    signalled = threading.Event()

    def close() -> None:
        signalled.wait(drain_delay)  # (returns at once on a second signal)
        # The batcher first, so that waiting requests get 503 now and uvicorn's graceful
        # shutdown waits only for the last round.
        batcher.close()
        server.should_exit = True  # uvicorn's own graceful shutdown

    def stop(sig: int, frame) -> None:
        stopped_by.append(sig)
        app.state.service.draining = True  # /v1/ready: 503 from now on
        if len(stopped_by) > 1:
            signalled.set()
            return
        # from a thread, as the main thread may hold the lock that `close` takes
        threading.Thread(target=close, name="mtkit-close", daemon=True).start()

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
        raise OSError(f"cannot listen on {host}:{port}: {(e.strerror or str(e)).lower()}") from None
    return sock
