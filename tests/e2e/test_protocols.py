"""`mtkit serve` speaks LibreTranslate's and DeepL's APIs: the real clients
(libretranslatepy, deepl) against a running server, and each route's shapes, codes and
errors through FastAPI's test client. Uses the tiny trained run of tests/conftest.py."""

from __future__ import annotations

import re
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
deepl = pytest.importorskip("deepl")
libretranslatepy = pytest.importorskip("libretranslatepy")
from fastapi.testclient import TestClient  # noqa: E402

import mtkit  # noqa: E402
from mtkit.core.search_options import SearchOptions  # noqa: E402
from mtkit.documents.formats import suffixes  # noqa: E402
from mtkit.documents.markup import tags  # noqa: E402
from mtkit.engines.loader import load_engine  # noqa: E402
from mtkit.serving.app import create_app  # noqa: E402
from mtkit.serving.scheduler import Limits  # noqa: E402

from serverkit import LocalServer  # noqa: E402

KEY = "sesame"
TEXTS = ["A dog runs in the park.", "Two men talk. A girl sings!", "", "A man in a blue shirt."]


@pytest.fixture(scope="module")
def model(trained) -> Path:
    return trained / "run" / "checkpoints" / "best.pt"


@pytest.fixture(scope="module")
def expected(model) -> list[str]:
    """What the Python API gives (the server's defaults: beam from the checkpoint)."""
    with mtkit.Translator.load(model, device="cpu") as t:
        return [x.text for x in t.translate(TEXTS)]


@pytest.fixture(scope="module")
def server(model):
    with LocalServer(model, "--api-key", KEY) as s:
        yield s


def test_libretranslatepy_translates_detects_and_lists(server, expected):
    lt = libretranslatepy.LibreTranslateAPI(f"http://127.0.0.1:{server.port}", api_key=KEY)
    assert [lt.translate(x, "en", "de") for x in TEXTS] == expected
    assert lt.languages() == [  # every language, a target-only one too (as LibreTranslate)
        {"code": "de", "name": "German", "targets": []},
        {"code": "en", "name": "English", "targets": ["de"]},
    ]
    status, settings = server.get("/frontend/settings")  # (libretranslatepy reads none)
    assert status == 200 and settings["keyRequired"] is True and settings["charLimit"] == 20_000
    (found,) = lt.detect("A man is riding a bike and the dogs are playing.")
    assert found["language"] == "en" and 0 < found["confidence"] <= 100
    wrong = libretranslatepy.LibreTranslateAPI(f"http://127.0.0.1:{server.port}", api_key="x")
    with pytest.raises(urllib.error.HTTPError) as e:
        wrong.translate("A dog.", "en", "de")
    assert e.value.code == 403


def test_the_deepl_client_translates_and_lists(server, expected):
    client = deepl.Translator(KEY, server_url=f"http://127.0.0.1:{server.port}")
    results = client.translate_text(TEXTS, target_lang="DE", source_lang="EN")
    assert [r.text for r in results] == expected
    assert {r.detected_source_lang for r in results} == {"EN"}
    one = client.translate_text(TEXTS[0], target_lang="DE")
    assert one.text == expected[0]
    assert [x.code for x in client.get_source_languages()] == ["EN"]
    assert [x.code for x in client.get_target_languages()] == ["DE"]
    assert client.get_usage().character.count >= sum(map(len, TEXTS))
    tagged = client.translate_text("A <b>dog</b> runs.", target_lang="DE", tag_handling="html")
    assert tagged.text.count("<b>") == 1 and tagged.text.count("</b>") == 1
    with pytest.raises(deepl.AuthorizationException):
        deepl.Translator("wrong", server_url=f"http://127.0.0.1:{server.port}").translate_text(
            "A dog.", target_lang="DE"
        )
    with pytest.raises(deepl.DeepLException, match="target_lang"):
        client.translate_text("A dog.", target_lang="FR")


SEGMENT = (
    "Select <parmname>Multiple Languages</parmname> and <uicontrol>add</uicontrol> the "
    "<zz>languages</zz> you <kk>want</kk>."
)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"ignore_tags": ["zz", "parmname"]},
        {"non_splitting_tags": "zz,kk"},
        {"splitting_tags": ["parmname", "uicontrol"]},
        {"outline_detection": False, "splitting_tags": "kk"},
    ],
    ids=["none", "ignore", "non-splitting", "splitting", "no-outline"],
)
def test_the_deepl_client_s_xml_options_translate_as_the_api_does(server, model, options):
    """A segment (no root) with tag_handling=xml and each of DeepL's XML options, sent by
    the real client (as it sends them: lists, and outline_detection a JSON boolean): what
    the Python API gives with the same options, exactly the segment's tags, and an
    ignored element's content as it was."""
    client = deepl.Translator(KEY, server_url=f"http://127.0.0.1:{server.port}")
    got = client.translate_text(SEGMENT, target_lang="DE", tag_handling="xml", **options).text
    with mtkit.Translator.load(model, device="cpu") as t:
        (want,) = t.translate([SEGMENT], format="xml", split=True, **options)
    assert got == want.text
    assert tags(got, "xml") == tags(SEGMENT, "xml")
    if "ignore_tags" in options:
        assert "<zz>languages</zz>" in got and "<parmname>Multiple Languages</parmname>" in got


def test_the_deepl_client_s_bad_xml_option_is_a_400_naming_it(server):
    client = deepl.Translator(KEY, server_url=f"http://127.0.0.1:{server.port}")
    with pytest.raises(deepl.DeepLException, match="Value for 'splitting_tags' not supported"):
        client.translate_text(SEGMENT, target_lang="DE", tag_handling="xml", splitting_tags="<p>")


def test_deepl_s_xml_options_as_a_form(api, model):
    """A form sends each option as text: names comma-separated, outline_detection 0."""
    fields = {
        "text": SEGMENT,
        "target_lang": "DE",
        "tag_handling": "html",
        "ignore_tags": "zz,parmname",
        "outline_detection": "0",
        "splitting_tags": "kk",
    }
    r = api.post("/v2/translate", data=fields)
    assert r.status_code == 200, r.text
    with mtkit.Translator.load(model, device="cpu") as t:
        (want,) = t.translate(
            [SEGMENT],
            format="html",
            split=True,
            ignore_tags="zz,parmname",
            outline_detection=False,
            splitting_tags=["kk"],
        )
    assert r.json()["translations"][0]["text"] == want.text
    r = api.post("/v2/translate", data={**fields, "outline_detection": "maybe"})
    assert r.status_code == 400
    assert r.json()["message"] == (
        "Value for 'outline_detection' not supported: outline_detection must be true or "
        "false (1 or 0), got 'maybe'"
    )


def test_libretranslate_html_keeps_a_sentence_of_unknown_elements_whole(server, model):
    """LibreTranslate's #806: parmname, uicontrol are inline (HTML's unknown elements), so
    the segment is one sentence, translated as its text without tags is, and exactly its
    tags come back."""
    segment = "Select <parmname>Multiple Languages</parmname> and <uicontrol>add</uicontrol> them."
    status, body = server.request(  # (libretranslatepy sends no format: by hand)
        "POST",
        "/translate",
        {"q": segment, "source": "en", "target": "de", "format": "html", "api_key": KEY},
    )
    assert status == 200, body
    got = body["translatedText"]
    assert tags(got, "html") == tags(segment, "html")
    with mtkit.Translator.load(model, device="cpu") as t:
        (plain,) = t.translate(["Select Multiple Languages and add them."], split=True)
    assert re.sub(r"<[^>]+>", "", got).split() == plain.text.split()


def test_clients_of_three_protocols_at_once_get_what_they_get_alone(server, expected):
    """16 clients at once, mixing /v1, LibreTranslate and DeepL: the same outputs as one
    by one, and no 500."""
    lt = libretranslatepy.LibreTranslateAPI(f"http://127.0.0.1:{server.port}", api_key=KEY)
    dl = deepl.Translator(KEY, server_url=f"http://127.0.0.1:{server.port}")

    def call(k: int) -> list[str]:
        if k % 3 == 0:
            return [lt.translate(x, "en", "de") for x in TEXTS]
        if k % 3 == 1:
            return [r.text for r in dl.translate_text(TEXTS, target_lang="DE")]
        status, body = server.request(
            "POST", "/v1/translate", {"text": TEXTS}, headers={"Authorization": f"Bearer {KEY}"}
        )
        assert status == 200, body
        return [t["text"] for t in body["translations"]]

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(call, range(16)))
    # /v1 does not split a line into sentences; the two others do, as the API does
    for k, got in enumerate(answers):
        if k % 3 == 2:
            assert [got[i] for i in (0, 2, 3)] == [expected[i] for i in (0, 2, 3)]
        else:
            assert got == expected


@pytest.fixture(scope="module")
def api(model):
    engine = load_engine(model, "cpu")
    app = create_app(
        engine, SearchOptions.from_config(engine.config.decode), Limits(max_lines=8), "best.pt"
    )
    with TestClient(app) as c:
        yield c


def test_libretranslate_shapes_and_errors(api, expected):
    both = api.post("/translate", json={"q": TEXTS[:2], "source": "en", "target": "de"})
    assert both.status_code == 200 and both.json() == {"translatedText": expected[:2]}
    form = api.post(
        "/translate", data={"q": TEXTS[0], "source": "auto", "target": "de", "alternatives": "2"}
    )
    body = form.json()
    assert body["translatedText"] == expected[0] and len(body["alternatives"]) == 2
    assert body["detectedLanguage"]["language"] == "en"
    html = api.post(
        "/translate",
        json={"q": "<p>A <i>dog</i> runs.</p>", "source": "en", "target": "de", "format": "html"},
    ).json()
    assert html["translatedText"].startswith("<p>") and html["translatedText"].count("<i>") == 1
    for fields, says in (
        ({"source": "en", "target": "de"}, "missing q parameter"),
        ({"q": "A dog.", "source": "en", "target": "fr"}, "fr is not supported"),
        ({"q": "A dog.", "source": "xx", "target": "de"}, "xx is not supported"),
        ({"q": "A dog.", "source": "en", "target": "de", "format": "pdf"}, "format"),
        ({"q": "A dog.", "source": "en", "target": "de", "alternatives": 2.5}, "whole number"),
        ({"q": "A dog.", "source": "en", "target": "de", "alternatives": True}, "whole number"),
        ({"q": "<b>" * 3000 + "x", "source": "en", "target": "de", "format": "html"}, "deep"),
        ({"q": "<p>a</b>", "source": "en", "target": "de", "format": "html"}, None),
    ):
        r = api.post("/translate", json=fields)
        if says is None:  # a best-effort parse, not an error
            assert r.status_code == 200
            continue
        assert r.status_code == 400 and says in r.json()["error"], r.json()
    too_many = api.post("/translate", json={"q": ["a"] * 9, "source": "en", "target": "de"})
    assert too_many.status_code == 413 and "at most 8" in too_many.json()["error"]
    assert (
        api.post(
            "/translate", content=b"\xff", headers={"content-type": "application/json"}
        ).status_code
        == 400
    )
    infinite = b'{"q": "a", "source": "en", "target": "de", "alternatives": 1e999}'
    answer = api.post("/translate", content=infinite, headers={"content-type": "application/json"})
    assert answer.status_code == 400 and "whole number" in answer.json()["error"]


def test_deepl_shapes_and_errors(api, expected):
    r = api.post("/v2/translate", json={"text": TEXTS, "target_lang": "DE"})
    assert r.json() == {
        "translations": [
            {"detected_source_language": "EN", "text": t, "billed_characters": len(x)}
            for t, x in zip(expected, TEXTS)
        ]
    }
    whole = api.post(
        "/v2/translate", json={"text": [TEXTS[1]], "target_lang": "de", "split_sentences": "0"}
    ).json()
    assert whole["translations"][0]["text"] != expected[1]  # the line translated whole
    for fields, says in (
        ({"target_lang": "DE"}, "Parameter 'text' not specified."),
        ({"text": ["a"]}, "Parameter 'target_lang' not specified."),
        ({"text": ["a"], "target_lang": "DE", "tag_handling": "pdf"}, "tag_handling"),
        ({"text": ["a"], "target_lang": "DE", "source_lang": "FR"}, "source_lang"),
    ):
        r = api.post("/v2/translate", json=fields)
        assert r.status_code == 400 and says in r.json()["message"]
    assert api.get("/v2/languages", params={"type": "target"}).json()[0]["language"] == "DE"
    assert "/v2/translate" in api.get("/openapi.json").json()["paths"]
    assert "/translate" in api.get("/openapi.json").json()["paths"]


def test_a_key_that_is_not_text_is_refused_not_a_500(model):
    engine = load_engine(model, "cpu")
    app = create_app(
        engine, SearchOptions.from_config(engine.config.decode), Limits(), "best.pt", api_key=KEY
    )
    with TestClient(app) as c:
        for key in (123, [KEY], None):
            r = c.post(
                "/translate", json={"q": "A dog.", "source": "en", "target": "de", "api_key": key}
            )
            assert r.status_code == 403 and r.json() == {"error": "Invalid API key"}
        form = b"q=A+dog.&source=en&target=de&api_key=x&api_key=y"
        r = c.post(
            "/translate",
            content=form,
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert r.status_code == 403
        assert c.post("/detect", json={"q": "A dog.", "api_key": 123}).status_code == 403
        ok = c.post(
            "/translate", json={"q": "A dog.", "source": "en", "target": "de", "api_key": KEY}
        )
        assert ok.status_code == 200


def app_client(model, **kw) -> TestClient:
    """The app of `model`, with `create_app`'s keywords (an API key, CORS origins)."""
    engine = load_engine(model, "cpu")
    decode = SearchOptions.from_config(engine.config.decode)
    return TestClient(create_app(engine, decode, Limits(max_body_bytes=4096), "best.pt", **kw))


@pytest.mark.parametrize(
    "given",
    ["--3", "²", "٣", "1_0", "9" * 5000, " 1.5"],
    ids=["dashes", "superscript", "arabic-digit", "underscore", "5000-digits", "decimal"],
)
def test_a_form_number_that_int_cannot_read_is_a_400(api, given):
    form = {"q": "A dog", "source": "en", "target": "de", "alternatives": given}
    r = api.post("/translate", data=form)
    assert r.status_code == 400
    assert r.json() == {"error": "Invalid request: alternatives must be a whole number"}


def test_alternatives_of_a_document_are_refused_as_the_cli_refuses_them(api):
    for q in ("<p>A dog <b>runs</b>.</p>", ["<p>A dog.</p>", "<p>A cat.</p>"]):
        r = api.post(
            "/translate",
            json={"q": q, "source": "en", "target": "de", "format": "html", "alternatives": 2},
        )
        assert r.status_code == 400 and r.json() == {
            "error": "Invalid request: alternatives are for text; format html writes a document"
        }


def test_auto_takes_short_texts_in_the_models_language_as_it(api):
    """Detected among every language, these were Turkish, Breton, Javanese and (the batch)
    Afrikaans, and refused; among the model's one source language each is English."""
    for q in ("A girl.", "Hello", "A woman sings.", ["A man is riding a bike.", "OK"]):
        r = api.post("/translate", json={"q": q, "source": "auto", "target": "de"})
        assert r.status_code == 200, r.json()
        found = r.json()["detectedLanguage"]
        assert found == (
            [{"confidence": 100.0, "language": "en"}] * len(q)
            if isinstance(q, list)
            else {"confidence": 100.0, "language": "en"}
        )
    # /detect still tells every language apart
    assert api.post("/detect", json={"q": "Der Hund rennt über die Wiese."}).json() == [
        {"confidence": 100.0, "language": "de"}
    ]


def test_every_api_refuses_in_its_own_shape(model):
    """Unknown paths, wrong methods and an over-size body: DeepL's {"message"} under /v2,
    {"error"} on LibreTranslate's and /v1's routes (never FastAPI's {"detail"})."""
    with app_client(model) as c:
        for method, path, status, body in (
            ("GET", "/translate", 405, {"error": "Method Not Allowed"}),
            ("GET", "/detect", 405, {"error": "Method Not Allowed"}),
            ("GET", "/v1/translate", 405, {"error": "Method Not Allowed"}),
            ("GET", "/v1/nope", 404, {"error": "Not Found"}),
            ("GET", "/nope", 404, {"error": "Not Found"}),
            ("PATCH", "/v2/translate", 405, {"message": "Method Not Allowed"}),
            ("GET", "/v2/nope", 404, {"message": "Not Found"}),
            ("OPTIONS", "/translate", 405, {"error": "Method Not Allowed"}),
        ):
            r = c.request(method, path)
            assert (r.status_code, r.json()) == (status, body), (method, path)
        big = {"text": ["a" * 5000], "target_lang": "DE"}
        r = c.post("/v2/translate", json=big)
        assert r.status_code == 413 and r.json() == {
            "message": "the request body is over 4096 bytes"
        }
        r = c.post("/translate", json={"q": "a" * 5000, "source": "en", "target": "de"})
        assert r.status_code == 413 and r.json() == {"error": "the request body is over 4096 bytes"}
        r = c.get("/v2/languages", params={"type": "foo"})
        assert r.status_code == 400 and r.json() == {"message": "Value for 'type' not supported."}


def test_cors_origins_get_their_preflights_answered(model):
    preflight = {"Origin": "https://example.org", "Access-Control-Request-Method": "POST"}
    with app_client(model, api_key=KEY, cors_origins=["*"]) as c:
        for path in ("/translate", "/v2/translate", "/v1/translate"):
            r = c.options(
                path, headers={**preflight, "Access-Control-Request-Headers": "authorization"}
            )
            assert r.status_code == 200, path
            assert r.headers["access-control-allow-origin"] == "*"
            assert "POST" in r.headers["access-control-allow-methods"]
        r = c.post(
            "/translate",
            json={"q": "A dog.", "source": "en", "target": "de", "api_key": KEY},
            headers={"Origin": "https://example.org"},
        )
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
    with app_client(model, cors_origins=["https://example.org"]) as c:
        other = {**preflight, "Origin": "https://elsewhere.example"}
        assert c.options("/translate", headers=other).status_code == 400
        assert c.options("/translate", headers=preflight).status_code == 200


@pytest.mark.parametrize("header", ["bearer sesame", "Bearer  sesame", "BEARER\tsesame "])
def test_every_route_reads_the_key_of_one_authorization_parse(model, header):
    with app_client(model, api_key=KEY) as c:
        auth = {"Authorization": header}
        assert c.post("/v1/translate", json={"text": ["A dog."]}, headers=auth).status_code == 200
        lt = {"q": "A dog.", "source": "en", "target": "de"}
        assert c.post("/translate", json=lt, headers=auth).status_code == 200
        deepl = {"text": ["A dog."], "target_lang": "DE"}
        assert c.post("/v2/translate", json=deepl, headers=auth).status_code == 200
        dl = {"Authorization": "deepl-auth-key  " + KEY}
        assert c.post("/v2/translate", json=deepl, headers=dl).status_code == 200
        wrong = {"Authorization": header.replace(KEY, "sesam")}
        assert c.post("/v1/translate", json={"text": ["A dog."]}, headers=wrong).status_code == 401
        assert c.post("/translate", json=lt, headers=wrong).status_code == 403


@pytest.mark.parametrize(
    "body, query",
    [
        (b"q=%FF&source=en&target=de", ""),
        (b"source=en&target=de", "q=%FF"),
        (b"q=\xff&source=en&target=de", ""),
    ],
)
def test_a_form_that_is_not_utf8_is_a_400_raw_or_percent_encoded(api, body, query):
    r = api.post(
        "/translate?" + query,
        content=body,
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 400 and r.json()["error"].startswith("the ")
    assert "is not UTF-8" in r.json()["error"]


def test_a_text_with_nothing_visible_is_empty_on_every_route(api):
    texts = ["\u200b", " \ufeff\u2060 ", "\u00ad"]
    lt = api.post("/translate", json={"q": texts, "source": "en", "target": "de"}).json()
    assert lt == {"translatedText": ["", "", ""]}
    v1 = api.post("/v1/translate", json={"text": texts}).json()
    assert [t["text"] for t in v1["translations"]] == ["", "", ""]


def test_languages_lists_every_language_and_frontend_settings_say_what_is_served(model):
    """LibreTranslate lists every language it has loaded, one it only translates into with
    the targets it has (none here), and clients build their menus from it; its web page
    and some clients read /frontend/settings (LibreTranslate's fields, mtkit's values)."""
    both = [
        {"code": "de", "name": "German", "targets": []},
        {"code": "en", "name": "English", "targets": ["de"]},
    ]
    for kw, keyed in (({}, False), ({"api_key": KEY}, True)):
        with app_client(model, **kw) as c:
            assert c.get("/languages").json() == both
            assert c.post("/languages").json() == both
            r = c.get("/frontend/settings")  # (open, as LibreTranslate's: it holds no data)
            assert r.status_code == 200 and r.json() == {
                "charLimit": 20_000,
                "frontendTimeout": 500,
                "apiKeys": keyed,
                "keyRequired": keyed,
                "suggestions": False,
                "filesTranslation": True,
                "supportedFilesFormat": list(suffixes()),
                "language": {
                    "source": {"code": "en", "name": "English"},
                    "target": {"code": "de", "name": "German"},
                },
            }
            assert c.post("/frontend/settings").json() == {"error": "Method Not Allowed"}


@pytest.mark.parametrize("tags", ["xml", "html"])
def test_an_empty_text_in_a_deepl_batch_of_markup_is_empty(api, tags):
    r = api.post(
        "/v2/translate",
        json={"text": ["", "<p>A dog.</p>"], "target_lang": "DE", "tag_handling": tags},
    )
    assert r.status_code == 200, r.text
    texts = [t["text"] for t in r.json()["translations"]]
    assert texts[0] == "" and texts[1].startswith("<p>")


ROUTES = (  # each API's translate route, a request for it, and its refusals' key
    ("/v1/translate", {"text": ["A dog."]}, "error"),
    ("/translate", {"q": "A dog.", "source": "en", "target": "de"}, "error"),
    ("/v2/translate", {"text": ["A dog."], "target_lang": "DE"}, "message"),
)


def test_a_mistake_found_anywhere_is_a_4xx_and_a_bug_a_500_in_the_apis_shape(
    model, monkeypatch, caplog
):
    """Wherever it is raised, a `UserError` is the client's mistake: 400 (422 on /v1), in
    the API's shape; any other exception is a bug: logged once with its traceback, 500 in
    the API's shape, never a text/plain "Internal Server Error"."""
    from mtkit.core.errors import UserError
    from mtkit.serving import scheduler

    def raising(error: Exception):
        def check(*args) -> None:
            raise error

        monkeypatch.setattr(scheduler.Limits, "check", check)  # (every route's size check)

    with app_client(model) as c:
        raising(UserError("a mistake\nof two lines"))
        for path, body, key in ROUTES:
            r = c.post(path, json=body)
            assert r.status_code == (422 if path.startswith("/v1/") else 400), path
            assert r.json()[key] == "a mistake", path
        raising(ZeroDivisionError("a bug"))
        for path, body, key in ROUTES:
            caplog.clear()
            r = c.post(path, json=body)
            assert r.status_code == 500 and r.headers["content-type"] == "application/json"
            assert r.json() == {
                key: "internal error: the request failed in the server (a bug; its log says more)"
            }
            logged = [x for x in caplog.records if x.exc_info]
            assert (
                len(logged) == 1
                and logged[0].getMessage() == f"POST {path} failed (a bug in mtkit)"
            )
            assert isinstance(logged[0].exc_info[1], ZeroDivisionError)
