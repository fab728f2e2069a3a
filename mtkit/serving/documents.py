"""Documents over HTTP: DeepL's document API and LibreTranslate's file route, and the
queue that translates their documents in the background (`DocumentQueue`).

    POST /v2/document               DeepL: multipart file, target_lang, source_lang?,
                                    filename?, output_format? -> {document_id, document_key}
    POST /v2/document/{id}          DeepL: document_key -> {document_id, status,
                                    seconds_remaining?, billed_characters?, error_message?}
    POST /v2/document/{id}/result   DeepL: document_key -> the translated file (then deleted)
    POST /translate_file            LibreTranslate: multipart file, source, target, api_key
                                    -> {translatedFileUrl}, once translated
    GET  /download_file/{name}      LibreTranslate: the translated file, until it expires

A document's format is its file name's suffix (`mtkit.documents.formats.format_of`: a
format of `FORMATS`, or `.txt`, plain text whose lines are paragraphs; a PDF is refused
in words that say why). An upload answers at once; `DocumentQueue`'s worker threads
translate `DocumentLimits.workers` documents at a time through the server's session
(`mtkit.engines.session.Session.translate_data`), so through the same batcher and
scheduler as every text request, a document's sentences sent `chunk_lines` at a time
(its session's engine metered by its job: `mtkit.serving.scheduler.QueuedEngine.metered`),
so that text requests arriving meanwhile join the batcher's next round beside them
instead of waiting behind a whole document. A job belongs to no connection: its client
may leave and come back for the result. Results
are held in memory, deleted once downloaded (DeepL) or `expiry_s` after they are ready;
at shutdown the queued jobs end in an error, and the running ones as the batcher refuses
their next sentences (503), so that nothing waits on a job.
"""

from __future__ import annotations

import asyncio
import logging
import math
import mimetypes
import queue
import secrets
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath, PureWindowsPath
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException

from mtkit.core.errors import UserError
from mtkit.core.textio import document_encoding, read_document, write_document
from mtkit.documents.formats import format_of, listed, suffixes
from mtkit.engines.session import Session
from mtkit.serving.protocols import Protocols, fields
from mtkit.serving.scheduler import SHUTTING_DOWN, DocumentLimits, Limits, ServeError

log = logging.getLogger(__name__)

UPLOADS = ("/v2/document", "/translate_file")  # the routes whose bodies are a document
FORM_BYTES = 64 << 10  # what a multipart body holds beside its file (boundaries, fields)
WAIT_POLL_S = 0.1  # how often /translate_file looks whether its document is done
STOP_WAIT_S = 30.0  # how long shutdown waits for a worker to see its document end


def body_limit(path: str, limits: Limits) -> int:
    """The most bytes a request to `path` may send: a document and its form for the
    document routes (`DocumentLimits.max_bytes`), `Limits.max_body_bytes` for others."""
    return limits.documents.max_bytes + FORM_BYTES if path in UPLOADS else limits.max_body_bytes


def upload_format(filename: str) -> str:
    """The format of an uploaded file by its name's suffix (`formats.format_of`: a name
    in `FORMATS`, or "text" for .txt); 400 for one no format has, or one refused (a PDF),
    saying why."""
    try:
        found = format_of(filename)
    except UserError as e:
        raise ServeError(400, f"Unsupported file format: {e.line()}") from None
    if found is None:
        suffix = PurePosixPath(filename.lower()).suffix
        given = f"{suffix!r}" if suffix else "none"
        raise ServeError(
            400, f"Unsupported file format: the file name's suffix is {given}; "
            f"this server translates {listed(suffixes())}"
        )  # fmt: skip
    return found


def base_name(filename: str) -> str:
    """A file name as given, without any folder (a browser may send a Windows path)."""
    return PureWindowsPath(PurePosixPath(filename).name).name


def translate_text_file(session: Session, data: bytes) -> bytes:
    """A plain-text file translated: each line a paragraph (split into sentences by the
    session), blank lines and line endings kept, in the encoding it was read in."""
    encoding = document_encoding(data, None)
    lines = read_document(data, encoding).split("\n")
    bodies = [line.rstrip("\r") for line in lines]
    found = session.translate_texts([b if b.strip() else "" for b in bodies], "text")
    out = [
        (t.text if body.strip() else body) + line[len(body) :]
        for line, body, t in zip(lines, bodies, found, strict=True)
    ]
    return write_document("\n".join(out), encoding, references=False)


class DocumentTooLarge(UserError):
    """A document whose text is over `DocumentLimits.max_chars` (one line)."""


@dataclass
class DocumentJob:
    """One uploaded document, from the queue until its result is downloaded or expires.
    `data`: the upload until it is translated, then the translation. `characters`: those
    of its sentences translated so far (DeepL's billed characters); `estimate`: how many
    it will have, guessed from its size (for `seconds_remaining`). It meters its
    session's engine (`mtkit.serving.scheduler.Meter`): its sentences go to the batcher
    `chunk_lines` at a time, counted as they come back (`sent`), and a document whose
    text passes `max_chars` is refused before they are sent (`admit`)."""

    id: str
    key: str
    filename: str
    format: str  # a name in FORMATS, or "text"
    target: str | None  # the language a multilingual model translates into
    data: bytes
    estimate: int
    status: str = "queued"  # queued | translating | done | error
    error: str | None = None
    code: int = 0  # an error's HTTP status
    max_chars: int = DocumentLimits.max_chars
    chunk_lines: int = DocumentLimits.chunk_lines
    characters: int = 0
    started: float | None = None
    finished: float | None = None  # time.monotonic() when done or failed
    ended: threading.Event = field(default_factory=threading.Event)

    def seconds_remaining(self) -> int | None:
        """While translating: the time the characters left would take at the rate so far
        (None before the first sentences are back)."""
        if self.status != "translating" or not self.characters or self.started is None:
            return None
        rate = self.characters / max(time.monotonic() - self.started, 1e-3)
        return math.ceil(max(self.estimate - self.characters, 0) / rate)

    def end(self, status: str, error: str | None = None, code: int = 0) -> None:
        self.status, self.error, self.code = status, error, code
        self.finished = time.monotonic()
        self.ended.set()

    def admit(self, lines: list[str]) -> None:
        """`DocumentTooLarge` where `lines` would take its text past `max_chars`."""
        if self.characters + sum(map(len, lines)) > self.max_chars:
            raise DocumentTooLarge(
                f"the document is too large: over {self.max_chars:,} characters of text"
            )

    def sent(self, lines: list[str]) -> None:
        """Count `lines`, translated."""
        self.characters += sum(map(len, lines))


class DocumentQueue:
    """The documents of the server's clients: queued, translated by `limits.workers`
    threads through `service`'s session (`mtkit.serving.app.Service`), kept until
    downloaded or expired. At most `limits.max_jobs` at once (429 beyond)."""

    def __init__(self, service, limits: DocumentLimits):
        self.service, self.limits = service, limits
        self.jobs: dict[str, DocumentJob] = {}
        self._queue: queue.Queue[DocumentJob | None] = queue.Queue()
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        self._closed = False

    def submit(self, data: bytes, filename: str, format: str, target: str | None) -> DocumentJob:
        """Queue a document; 429 where `max_jobs` are held, 503 once shutting down."""
        with self._lock:
            if self._closed:
                raise ServeError(503, SHUTTING_DOWN)
            self._expire()
            if len(self.jobs) >= self.limits.max_jobs:
                raise ServeError(
                    429,
                    f"Too many requests: {self.limits.max_jobs} documents are queued, "
                    "translating or awaiting download; retry shortly",
                )
            job = DocumentJob(
                secrets.token_hex(16), secrets.token_hex(32), filename, format, target, data,
                estimate=len(data), max_chars=self.limits.max_chars,
                chunk_lines=self.limits.chunk_lines,
            )  # fmt: skip
            self.jobs[job.id] = job
            if not self._workers:  # (the first document starts them: the session exists)
                self._workers = [
                    threading.Thread(target=self._work, name=f"mtkit-document-{i}", daemon=True)
                    for i in range(self.limits.workers)
                ]
                for worker in self._workers:
                    worker.start()
        self._queue.put(job)
        return job

    def find(self, document_id: str, key: str | None) -> DocumentJob:
        """The job `document_id`: 404 where there is none (or it expired), 403 where
        `key` is not its key (None: not asked)."""
        with self._lock:
            self._expire()
            job = self.jobs.get(document_id)
        if job is None:
            raise ServeError(404, "Document not found")
        if key is not None and not secrets.compare_digest(
            key.encode("utf-8", "surrogatepass"), job.key.encode()
        ):
            raise ServeError(403, "Authorization failure: wrong document_key")
        return job

    def result(self, job: DocumentJob, keep: bool = False) -> bytes:
        """A done job's translation, deleted unless `keep`; 503 (DeepL's "not ready")
        before it is done; where it failed, the job's own error (its status), the job
        deleted (told once)."""
        if job.status not in ("done", "error"):
            raise ServeError(503, "Document not ready")
        if job.status == "error" or not keep:
            with self._lock:
                self.jobs.pop(job.id, None)
        if job.status == "error":
            raise ServeError(job.code, job.error or "the document could not be translated")
        return job.data

    def suffixes(self) -> list[str]:
        """The suffixes of the files it takes (LibreTranslate's supportedFilesFormat)."""
        return list(suffixes())

    def close(self) -> None:
        """Take no more documents: the queued ones end in an error (503) at once; the
        running ones end as the batcher, closing, refuses their next sentences."""
        with self._lock:
            self._closed = True
            queued = [j for j in self.jobs.values() if j.status == "queued"]
        for job in queued:
            job.data = b""
            job.end("error", "the server shut down before translating the document", 503)
        for _ in self._workers:
            self._queue.put(None)

    def stop(self) -> None:
        """`close`, then wait (up to STOP_WAIT_S) for the workers to return."""
        self.close()
        deadline = time.monotonic() + STOP_WAIT_S
        for worker in self._workers:
            worker.join(max(deadline - time.monotonic(), 0))

    def _expire(self) -> None:
        """Delete the results (and errors) ready for longer than `expiry_s` (under the
        lock)."""
        now = time.monotonic()
        for job in list(self.jobs.values()):
            if job.finished is not None and now - job.finished > self.limits.expiry_s:
                del self.jobs[job.id]

    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            if job.status == "queued":  # (not ended by `close`)
                self._translate(job)

    def _translate(self, job: DocumentJob) -> None:
        """One document through the server's session, its end recorded in the job."""
        job.status, job.started = "translating", time.monotonic()
        session = replace(
            self.service.session,
            engine=self.service.session.engine.metered(job),
            tgt_lang=job.target,
            split=True,
        )
        try:
            if job.format == "text":
                out = translate_text_file(session, job.data)
            else:
                out = session.translate_data(job.data, job.format)
        except ServeError as e:  # the batcher's: shutting down, or too busy
            job.data = b""
            job.end("error", str(e), e.status)
        except UserError as e:  # the document's own fault, in one line
            job.data = b""
            job.end("error", e.line(), 413 if "too large" in e.line() else 400)
        except Exception:
            log.exception("translating the document %s failed (a bug in mtkit)", job.filename)
            job.data = b""
            job.end("error", "internal error: the document failed in the server (a bug)", 500)
        else:
            job.data = out
            job.end("done")


async def _upload(request: Request, limits: DocumentLimits) -> tuple[FormData, bytes, str]:
    """A multipart request's fields, its file's bytes and its file's name: 400 for a
    body that is no multipart form, no file or an empty one; 413 over `max_bytes` (the
    whole body is bounded before it is read, by `BodyReader`)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "multipart/form-data":
        raise ServeError(400, "send the document as multipart/form-data, in the field 'file'")
    try:
        form = await request.form(max_files=1, max_fields=32)
    except HTTPException as e:
        raise ServeError(400, f"the multipart body cannot be read: {e.detail}") from None
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise ServeError(400, "Parameter 'file' not specified.")
    try:
        data = await upload.read(limits.max_bytes + 1)
    finally:
        await form.close()
    if len(data) > limits.max_bytes:
        raise ServeError(413, f"the document is too large: over {limits.max_bytes:,} bytes")
    if not data:
        raise ServeError(400, "the file is empty")
    return form, data, base_name(upload.filename or "")


def _attachment(data: bytes, filename: str) -> Response:
    """A file's bytes as a download named `filename`."""
    kind = mimetypes.guess_type(filename)[0] or "application/octet-stream"
    disposition = f"attachment; filename*=UTF-8''{quote(filename)}"
    return Response(data, media_type=kind, headers={"Content-Disposition": disposition})


def add_document_routes(app: FastAPI, protocols: Protocols) -> DocumentQueue:
    """Add DeepL's and LibreTranslate's document routes to `app`; returns their queue
    (the server stops it at shutdown)."""
    service = protocols.service
    documents = DocumentQueue(service, service.limits.documents)
    _deepl(app, protocols, documents)
    _libretranslate(app, protocols, documents)
    return documents


def _deepl(app: FastAPI, protocols: Protocols, documents: DocumentQueue) -> None:
    @app.post("/v2/document", tags=["DeepL"])
    async def upload(request: Request):
        """DeepL's document upload: multipart file, target_lang, source_lang, filename
        (the file's name, where the file part has none), output_format (the input's own
        only). Answers at once with the document's id and key."""
        protocols.deepl_key(request)
        form, data, name = await _upload(request, documents.limits)
        name = base_name(str(form.get("filename") or "")) or name
        fmt = upload_format(name)
        _, target = protocols.deepl_languages(form)
        wanted = str(form.get("output_format") or "").lower().lstrip(".")
        if wanted and f".{wanted}" not in suffixes(fmt):  # (no conversions)
            raise ServeError(400, "Value for 'output_format' not supported.")
        job = documents.submit(data, name, fmt, protocols.tgt_lang(target))
        return {"document_id": job.id, "document_key": job.key}

    @app.post("/v2/document/{document_id}", tags=["DeepL"])
    async def status(document_id: str, request: Request):
        """DeepL's document status: queued, translating (with seconds_remaining), done or
        error (with error_message); billed_characters so far."""
        protocols.deepl_key(request)
        job = documents.find(document_id, _document_key(await fields(request)))
        out: dict = {"document_id": job.id, "status": job.status}
        remaining = job.seconds_remaining()
        if remaining is not None:
            out["seconds_remaining"] = remaining
        if job.status != "queued":
            out["billed_characters"] = job.characters
        if job.error:
            out["error_message"] = job.error
        return out

    @app.post("/v2/document/{document_id}/result", tags=["DeepL"])
    async def result(document_id: str, request: Request):
        """DeepL's document download: the translated file, deleted from the server once
        sent (503 before it is done)."""
        protocols.deepl_key(request)
        job = documents.find(document_id, _document_key(await fields(request)))
        data = documents.result(job)
        return _attachment(data, job.filename)


def _document_key(given: dict) -> str:
    key = given.get("document_key")
    if not isinstance(key, str) or not key:
        raise ServeError(400, "Parameter 'document_key' not specified.")
    return key


def _libretranslate(app: FastAPI, protocols: Protocols, documents: DocumentQueue) -> None:
    @app.post("/translate_file", tags=["LibreTranslate"])
    async def translate_file(request: Request):
        """LibreTranslate's file translation: multipart file, source (a code or auto),
        target, api_key. Answers once the file is translated, with the URL to download
        it from (until it expires); a client that leaves first leaves the job running."""
        form, data, name = await _upload(request, documents.limits)
        protocols.libretranslate_key(request, {"api_key": form.get("api_key")})
        _, target, _ = protocols.libretranslate_languages(form)  # (auto: the first source)
        fmt = upload_format(name)
        job = documents.submit(data, name, fmt, protocols.tgt_lang(target))
        while not job.ended.is_set():
            await asyncio.sleep(WAIT_POLL_S)
        documents.result(job, keep=True)  # (its error, where it failed)
        return {"translatedFileUrl": f"{request.base_url}download_file/{job.id}.{job.filename}"}

    @app.get("/download_file/{name}", tags=["LibreTranslate"])
    async def download_file(name: str):
        """LibreTranslate's download: a file /translate_file translated, named as its
        URL says (the document's id, a dot, the file's name), until it expires."""
        document_id, _, filename = name.partition(".")
        job = documents.find(document_id, None)
        if filename != job.filename:
            raise ServeError(404, "Document not found")
        data = documents.result(job, keep=True)
        return _attachment(data, filename)
