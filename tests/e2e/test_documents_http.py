# ruff: noqa: E501  (the XLIFF file below is written a unit to a line, as tools write them)
"""Documents over HTTP (`mtkit.serving.documents`): DeepL's /v2/document (the real
`deepl` client's `translate_document_from_filepath` and `translate_document` against a
running `mtkit serve`) and LibreTranslate's /translate_file (as its web page sends it,
with httpx: libretranslatepy has no file call) give what the same session gives the
file directly; every bad upload is a 4xx in its API's shape. Uses the tiny trained run
of tests/conftest.py."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
deepl = pytest.importorskip("deepl")
httpx = pytest.importorskip("httpx")
xliff1 = pytest.importorskip("translate.storage.xliff")
srt = pytest.importorskip("srt")
from fastapi.testclient import TestClient  # noqa: E402

from mtkit.core.search_options import SearchOptions  # noqa: E402
from mtkit.documents.formats import REFUSED  # noqa: E402
from mtkit.documents.markup import tags  # noqa: E402
from mtkit.engines.loader import load_engine  # noqa: E402
from mtkit.engines.session import Session  # noqa: E402
from mtkit.serving.app import create_app  # noqa: E402
from mtkit.serving.documents import FORM_BYTES  # noqa: E402
from mtkit.serving.scheduler import DocumentLimits, Limits  # noqa: E402

from conftest import cli, one_line_error  # noqa: E402
from serverkit import LocalServer  # noqa: E402

KEY = "sesame"
PAGE = (
    "<html><body><h1>A dog.</h1>\n<p>A man is <b>riding</b> a <a href='/b'>bike</a>. "
    "Two dogs play.<br>A woman <i>sings</i>!</p><pre>ls -l</pre></body></html>\n"
)
XLIFF = """<?xml version="1.0" encoding="UTF-8"?>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">
  <file original="a.html" source-language="en" datatype="html">
    <body>
      <trans-unit id="1"><source>A man is <g id="1">riding</g> a bike<x id="2"/>.</source></trans-unit>
      <trans-unit id="2"><source>A woman sings.</source><target>Eine Frau singt.</target></trans-unit>
      <trans-unit id="3"><source>Two dogs run in the grass.</source></trans-unit>
    </body>
  </file>
</xliff>
"""
SUBTITLES = (
    "1\n00:00:01,000 --> 00:00:02,000\nA man runs.\n\n2\n00:00:03,000 --> 00:00:04,500\nTwo dogs.\n"
)
TEXT = "A dog runs. Two men talk.\r\n\r\nA girl sings!\n"
FILES = {"page.html": PAGE, "a.xlf": XLIFF, "a.srt": SUBTITLES, "notes.txt": TEXT}


@pytest.fixture(scope="module")
def model(trained) -> Path:
    return trained / "run" / "checkpoints" / "best.pt"


@pytest.fixture(scope="module")
def expected(model) -> dict[str, bytes]:
    """Each file as the server's session translates it, called directly (the server's
    defaults; a document's sentences split)."""
    from mtkit.documents.formats import format_of
    from mtkit.serving.documents import translate_text_file

    session = Session.open(load_engine(model, "cpu"), split=True)
    out = {}
    for name, text in FILES.items():
        fmt = format_of(name)
        data = text.encode()
        out[name] = (
            translate_text_file(session, data)
            if fmt == "text"
            else session.translate_data(data, fmt)
        )
    return out


@pytest.fixture(scope="module")
def server(model):
    with LocalServer(model, "--api-key", KEY) as s:
        yield s


@pytest.fixture
def quick_polls(monkeypatch):
    """The deepl client sleeps 5 s between status polls; here 0.05 s."""
    sleep = time.sleep
    monkeypatch.setattr(deepl.translator.time, "sleep", lambda s: sleep(min(s, 0.05)))


def test_the_deepl_client_translates_files_as_the_session_does(
    server, expected, tmp_path, quick_polls
):
    client = deepl.Translator(KEY, server_url=server.url)
    for name in ("page.html", "a.xlf", "a.srt", "notes.txt"):
        (tmp_path / name).write_text(FILES[name], newline="")
        out = tmp_path / f"out-{name}"
        status = client.translate_document_from_filepath(
            tmp_path / name, out, target_lang="DE", source_lang="EN"
        )
        assert status.done and status.billed_characters > 0, name
        assert out.read_bytes() == expected[name], name
    assert tags(expected["page.html"].decode()) == tags(PAGE)
    units = xliff1.xlifffile.parsestring(expected["a.xlf"]).units
    assert [u.target for u in units][1] == "Eine Frau singt." and all(u.target for u in units)
    assert [(c.index, c.start, c.end) for c in srt.parse(expected["a.srt"].decode())] == [
        (c.index, c.start, c.end) for c in srt.parse(SUBTITLES)
    ]
    assert expected["notes.txt"].decode().count("\r\n") == 2
    # file objects, as translate_document takes them
    source, sink = io.BytesIO(PAGE.encode()), io.BytesIO()
    source.name = "page.html"
    assert client.translate_document(source, sink, target_lang="DE").done
    assert sink.getvalue() == expected["page.html"]


def test_the_deepl_client_hears_every_refusal(server, tmp_path, quick_polls):
    client = deepl.Translator(KEY, server_url=server.url)
    (tmp_path / "a.pdf").write_bytes(b"%PDF-1.4")
    with pytest.raises(deepl.DeepLException, match="Unsupported file format: PDF is not tr"):
        client.translate_document_from_filepath(
            tmp_path / "a.pdf", tmp_path / "o.pdf", target_lang="DE"
        )
    with pytest.raises(deepl.AuthorizationException):
        deepl.Translator("wrong", server_url=server.url).translate_document_upload(
            PAGE, filename="p.html", target_lang="DE"
        )
    handle = client.translate_document_upload(PAGE, filename="p.html", target_lang="DE")
    wrong = deepl.DocumentHandle(handle.document_id, "0" * 64)
    with pytest.raises(deepl.AuthorizationException):
        client.translate_document_get_status(wrong)
    with pytest.raises(deepl.DeepLException, match="Not found"):
        client.translate_document_get_status(deepl.DocumentHandle("f" * 32, handle.document_key))
    assert client.translate_document_wait_until_done(handle).done
    client.translate_document_download(handle, io.BytesIO())
    with pytest.raises(deepl.DeepLException, match="Not found"):  # deleted once downloaded
        client.translate_document_download(handle, io.BytesIO())


def test_libretranslate_files_as_its_web_page_sends_them(server, expected):
    status, settings = server.get("/frontend/settings")
    assert status == 200 and settings["filesTranslation"] is True
    assert {".txt", ".html", ".xlf", ".srt", ".po"} <= set(settings["supportedFilesFormat"])
    for name in ("page.html", "a.xlf", "a.srt"):
        r = httpx.post(
            f"{server.url}/translate_file",
            data={"source": "en", "target": "de", "api_key": KEY},
            files={"file": (name, FILES[name].encode(), "application/octet-stream")},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        url = r.json()["translatedFileUrl"]
        assert url.startswith(f"{server.url}/download_file/") and url.endswith(f".{name}")
        for _ in range(2):  # kept until it expires, as LibreTranslate keeps it
            got = httpx.get(url, timeout=10)
            assert got.status_code == 200 and got.content == expected[name]
            assert got.headers["content-disposition"] == f"attachment; filename*=UTF-8''{name}"
    r = httpx.post(
        f"{server.url}/translate_file",
        data={"source": "en", "target": "de", "api_key": "wrong"},
        files={"file": ("page.html", PAGE.encode())},
    )
    assert (r.status_code, r.json()) == (403, {"error": "Invalid API key"})
    assert httpx.get(f"{server.url}/download_file/{'0' * 32}.page.html").status_code == 404


def test_a_client_that_leaves_leaves_its_job_running(server, expected):
    """The upload answers at once; the job runs whether or not anyone asks after it."""
    auth = {"Authorization": f"DeepL-Auth-Key {KEY}"}
    r = httpx.post(
        f"{server.url}/v2/document",
        data={"target_lang": "DE"},
        files={"file": ("page.html", PAGE.encode())},
        headers=auth,
    )
    job = r.json()
    assert r.status_code == 200 and set(job) == {"document_id", "document_key"}
    key = {"document_key": job["document_key"]}
    base = f"{server.url}/v2/document/{job['document_id']}"
    for _ in range(1200):
        status = httpx.post(base, json=key, headers=auth).json()
        if status["status"] == "done":
            break
        time.sleep(0.05)
    assert status == {
        "document_id": job["document_id"],
        "status": "done",
        "billed_characters": status["billed_characters"],
    }
    got = httpx.post(f"{base}/result", json=key, headers=auth)
    assert got.status_code == 200 and got.content == expected["page.html"]


SMALL = DocumentLimits(max_bytes=2_000, max_chars=60, max_jobs=3, expiry_s=3_600)


@pytest.fixture(scope="module")
def api(model):
    engine = load_engine(model, "cpu")
    app = create_app(
        engine, SearchOptions.from_config(engine.config.decode), Limits(documents=SMALL), "m"
    )
    with TestClient(app) as c:
        yield c


def _upload(api, name="a.html", data=PAGE.encode(), **form):
    return api.post(
        "/v2/document", data={"target_lang": "DE", **form}, files={"file": (name, data)}
    )


def _status(api, job) -> dict:
    for _ in range(1200):
        status = api.post(f"/v2/document/{job['document_id']}", json=job).json()
        if status["status"] in ("done", "error"):
            return status
        time.sleep(0.05)
    raise AssertionError(status)


@pytest.mark.parametrize(
    ("kw", "status", "message"),
    [
        ({"name": "a.docm"}, 400, "Unsupported file format: the file name's suffix is '.docm'"),
        ({"name": "noname"}, 400, "Unsupported file format: the file name's suffix is none"),
        ({"data": b""}, 400, "the file is empty"),
        ({"data": b"x" * 2_001}, 413, "the document is too large: over 2,000 bytes"),
        ({"target_lang": ""}, 400, "Parameter 'target_lang' not specified."),
        ({"target_lang": "FR"}, 400, "Value for 'target_lang' not supported."),
        ({"source_lang": "FR"}, 400, "Value for 'source_lang' not supported."),
        ({"output_format": "docx"}, 400, "Value for 'output_format' not supported."),
    ],
)
def test_bad_uploads_are_4xx_in_deepls_shape(api, kw, status, message):
    r = _upload(api, **kw)
    assert r.status_code == status and r.json()["message"].startswith(message), r.text


def test_uploads_that_are_no_file_are_400_and_too_big_bodies_413_unread(api):
    assert api.post("/v2/document", data={"target_lang": "DE"}).json() == {
        "message": "send the document as multipart/form-data, in the field 'file'"
    }
    r = api.post("/v2/document", data={"target_lang": "DE"}, files={"other": ("a.html", b"x")})
    assert (r.status_code, r.json()) == (400, {"message": "Parameter 'file' not specified."})
    r = _upload(api, data=b"x" * (2_000 + FORM_BYTES))  # refused by its Content-Length
    assert r.status_code == 413 and "request body is over" in r.json()["message"]
    r = api.post("/translate_file", files={"file": ("a.html", b"x" * (2_000 + FORM_BYTES))})
    assert r.status_code == 413 and "request body is over" in r.json()["error"]
    r = api.post(
        "/translate_file", data={"source": "en"}, files={"file": ("a.html", PAGE.encode())}
    )
    assert (r.status_code, r.json()) == (
        400,
        {"error": "Invalid request: missing target parameter"},
    )
    for name in ("a.pdf", "A.PDF"):  # refused by its name, saying why
        r = api.post(
            "/translate_file", data={"source": "en", "target": "de"}, files={"file": (name, b"x")}
        )
        assert (r.status_code, r.json()) == (
            400,
            {"error": f"Unsupported file format: {REFUSED['.pdf']}"},
        )
        assert "PDF is not translated" in r.json()["error"]
        r = _upload(api, name=name, data=b"%PDF-1.4")
        assert (r.status_code, r.json()) == (
            400,
            {"message": f"Unsupported file format: {REFUSED['.pdf']}"},
        )
    r = api.post(  # a format mtkit reads, whose bytes are not one: its format's one line
        "/translate_file", data={"source": "en", "target": "de"}, files={"file": ("a.odt", b"x")}
    )
    assert (r.status_code, r.json()) == (
        400,
        {"error": "the input is not an odt file: it is not a zip archive"},
    )


def test_status_and_result_refuse_unknown_ids_wrong_keys_early_and_second_downloads(api):
    job = _upload(api).json()
    path = f"/v2/document/{job['document_id']}"
    assert api.post(path, json={}).json() == {"message": "Parameter 'document_key' not specified."}
    r = api.post(path, json={"document_key": "x"})
    assert r.status_code == 403
    assert api.post("/v2/document/nothere", json=job).status_code == 404
    early = api.post(f"{path}/result", json=job)  # most likely still queued or translating
    assert early.status_code in (200, 503)
    if early.status_code == 503:
        assert early.json() == {"message": "Document not ready"}
        assert _status(api, job)["status"] == "done"
        assert api.post(f"{path}/result", json=job).status_code == 200
    again = api.post(f"{path}/result", json=job)
    assert (again.status_code, again.json()) == (404, {"message": "Document not found"})


def test_a_document_over_its_characters_ends_in_an_error_told_in_words(api):
    page = "<p>" + " ".join(["A man is riding a bike."] * 4) + "</p>"  # 95 characters
    job = _upload(api, data=page.encode()).json()
    status = _status(api, job)
    assert status["status"] == "error"
    assert status["error_message"] == "the document is too large: over 60 characters of text"
    r = api.post(f"/v2/document/{job['document_id']}/result", json=job)
    assert (r.status_code, r.json()["message"]) == (413, status["error_message"])
    r = api.post(
        "/translate_file",
        data={"source": "en", "target": "de"},
        files={"file": ("a.html", page.encode())},
    )
    assert (r.status_code, r.json()) == (413, {"error": status["error_message"]})


def test_a_document_that_cannot_be_read_is_an_error_of_its_format(api):
    job = _upload(api, name="a.srt", data=b"not a subtitle file\n").json()
    status = _status(api, job)
    assert status["status"] == "error" and status["error_message"]
    r = api.post(f"/v2/document/{job['document_id']}/result", json=job)
    assert r.status_code == 400 and r.json()["message"] == status["error_message"]


def test_more_documents_than_the_queue_holds_are_429(api):
    jobs = [_upload(api) for _ in range(SMALL.max_jobs + 2)]
    codes = [r.status_code for r in jobs]
    assert 429 in codes, codes
    refused = next(r for r in jobs if r.status_code == 429)
    assert refused.json()["message"].startswith("Too many requests")
    for r in jobs:  # downloaded: the queue is free again
        if r.status_code == 200:
            _status(api, r.json())
            api.post(f"/v2/document/{r.json()['document_id']}/result", json=r.json())
    assert _upload(api).status_code == 200


def test_sigterm_ends_queued_and_running_documents_cleanly(model):
    """Documents queued and translating when the server is stopped: a waiting
    /translate_file is answered (its file, or 503), the process exits 0 with no
    traceback."""
    from concurrent.futures import ThreadPoolExecutor

    page = "<p>" + " ".join(["A man is riding a bike on the street."] * 40) + "</p>\n"
    with LocalServer(model) as server, ThreadPoolExecutor(1) as pool:
        for _ in range(6):
            r = httpx.post(
                f"{server.url}/v2/document",
                data={"target_lang": "DE"},
                files={"file": ("a.html", (page * 10).encode())},
            )
            assert r.status_code == 200, r.text
        waiting = pool.submit(
            httpx.post,
            f"{server.url}/translate_file",
            data={"source": "en", "target": "de"},
            files={"file": ("b.html", (page * 10).encode())},
            timeout=120,
        )
        time.sleep(0.5)  # (its upload most likely in; either way it must be answered)
        code, err = server.stop()
        answer = waiting.result()
    assert code == 0 and "Traceback" not in err, err[-2000:]
    assert answer.status_code in (200, 503), answer.text
    if answer.status_code == 503:
        assert answer.json()["error"] in (
            "the server shut down before translating the document",
            "the server is shutting down; retry shortly",
        )


def test_results_nobody_downloads_are_deleted_after_their_expiry(model):
    """With an expiry of 0 s, a result is gone at the next look: its status is 404 once
    done, and LibreTranslate's URL answers 404."""
    engine = load_engine(model, "cpu")
    limits = Limits(documents=DocumentLimits(expiry_s=0))
    app = create_app(engine, SearchOptions.from_config(engine.config.decode), limits, "m")
    with TestClient(app) as api:
        job = _upload(api).json()
        seen = []
        for _ in range(1200):
            r = api.post(f"/v2/document/{job['document_id']}", json=job)
            seen.append(r.json().get("status", r.status_code))
            if r.status_code == 404:
                break
            time.sleep(0.05)
        assert seen[-1] == 404 and set(seen[:-1]) <= {"queued", "translating"}, seen
        r = api.post(
            "/translate_file",
            data={"source": "en", "target": "de"},
            files={"file": ("a.html", PAGE.encode())},
        )
        assert r.status_code == 200
        url = r.json()["translatedFileUrl"]
        assert api.get(url).status_code == 404


def test_the_deepl_client_translates_office_files_as_the_session_does(
    server, model, tmp_path, quick_polls
):
    """docx and pptx through DeepL's document API (the real client): the bytes the
    session writes for the file, read back by their own libraries, every paragraph's
    text translated."""
    docx = pytest.importorskip("docx")
    pptx = pytest.importorskip("pptx")
    from officefiles import make_docx, make_pptx

    session = Session.open(load_engine(model, "cpu"), split=True)
    client = deepl.Translator(KEY, server_url=server.url)
    for name, data in (("report.docx", make_docx()), ("slides.pptx", make_pptx())):
        (tmp_path / name).write_bytes(data)
        out = tmp_path / f"out-{name}"
        status = client.translate_document_from_filepath(tmp_path / name, out, target_lang="DE")
        assert status.done and status.billed_characters > 0, name
        assert out.read_bytes() == session.translate_data(data, name.rsplit(".", 1)[1]), name
    source = [p.text for p in docx.Document(tmp_path / "report.docx").paragraphs if p.text]
    output = [p.text for p in docx.Document(tmp_path / "out-report.docx").paragraphs if p.text]
    assert len(output) == len(source) and output != source
    deck = pptx.Presentation(tmp_path / "out-slides.pptx")
    assert deck.slides[0].shapes.title.text != "Hello world"


def test_a_zip_bomb_over_http_is_an_error_and_413(model, monkeypatch):
    """An office file unpacking past the bound (`office.MAX_UNPACKED`, lowered here) is
    refused from its listing: the job ends in an error told in words, its result a 413."""
    from mtkit.documents import office

    from officefiles import make_docx

    monkeypatch.setattr(office, "MAX_UNPACKED", 1000)
    engine = load_engine(model, "cpu")
    app = create_app(engine, SearchOptions.from_config(engine.config.decode), Limits(), "m")
    with TestClient(app) as api:
        job = _upload(api, name="bomb.docx", data=make_docx()).json()
        status = _status(api, job)
        assert status["status"] == "error" and "too large" in status["error_message"]
        r = api.post(f"/v2/document/{job['document_id']}/result", json=job)
        assert (r.status_code, r.json()["message"]) == (413, status["error_message"])


def test_serve_s_document_flags_set_the_limits_its_routes_keep(model):
    """`mtkit serve --document-*`: the limits /v1/info lists and the routes keep; a file
    the default 10 MiB takes is over --document-max-bytes 100, refused in each API's
    shape (the real deepl client hears the 413 and its reason), and a smaller one is not."""
    flags = {"max-bytes": 100, "max-chars": 5_000, "max-jobs": 5, "workers": 1, "expiry": 60}
    args = [x for name, value in flags.items() for x in (f"--document-{name}", str(value))]
    with LocalServer(model, *args) as server:
        status, info = server.get("/v1/info")
        assert status == 200 and info["limits"]["documents"] == {
            "max_bytes": 100, "max_chars": 5_000, "max_jobs": 5, "workers": 1,
            "expiry_s": 60.0, "chunk_lines": 16,
        }  # fmt: skip
        assert len(PAGE.encode()) > 100
        r = httpx.post(
            f"{server.url}/v2/document",
            data={"target_lang": "DE"},
            files={"file": ("page.html", PAGE.encode())},
        )
        assert (r.status_code, r.json()) == (
            413,
            {"message": "the document is too large: over 100 bytes"},
        )
        with pytest.raises(deepl.DeepLException, match="over 100 bytes") as refused:
            deepl.Translator("any", server_url=server.url).translate_document_upload(
                PAGE, filename="page.html", target_lang="DE"
            )
        assert refused.value.http_status_code == 413
        r = httpx.post(
            f"{server.url}/translate_file",
            data={"source": "en", "target": "de"},
            files={"file": ("page.html", PAGE.encode())},
        )
        assert (r.status_code, r.json()) == (
            413,
            {"error": "the document is too large: over 100 bytes"},
        )
        r = httpx.post(
            f"{server.url}/v2/document",
            data={"target_lang": "DE"},
            files={"file": ("small.html", b"<p>A dog runs.</p>")},
        )
        assert r.status_code == 200 and set(r.json()) == {"document_id", "document_key"}


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--document-max-bytes", "0", "--document-max-bytes must be at least 1 and at most "
         "1,073,741,824, got 0"),
        ("--document-max-bytes", "2147483648", "--document-max-bytes must be at least 1 and "
         "at most 1,073,741,824, got 2147483648"),
        ("--document-max-chars", "-1", "--document-max-chars must be at least 1, got -1"),
        ("--document-max-jobs", "0", "--document-max-jobs must be at least 1, got 0"),
        ("--document-workers", "65", "--document-workers must be at least 1 and at most 64, "
         "got 65"),
        ("--document-expiry", "nan", "--document-expiry must be at least 0 and at most "
         "604,800, got nan"),
        ("--document-expiry", "-1", "--document-expiry must be at least 0 and at most "
         "604,800, got -1.0"),
    ],
)  # fmt: skip
def test_a_document_flag_out_of_range_is_one_line_at_start(model, flag, value, says):
    one_line_error(cli("serve", "-m", model, flag, value), says)
