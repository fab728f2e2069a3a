"""The routes existing clients speak: LibreTranslate's and DeepL's (API v2).

    POST /translate        LibreTranslate: q (text or list), source (or auto), target,
                           format (text | html), alternatives, api_key
    GET|POST /languages    LibreTranslate: [{code, name, targets}], every language the model
                           reads or writes (one it only writes: the targets it has, often none)
    GET /frontend/settings LibreTranslate: its web page's and clients' settings
    POST /detect           LibreTranslate: [{confidence, language}]
    POST /v2/translate     DeepL: text (list), target_lang, source_lang, tag_handling
                           (html | xml: a document or a fragment), split_sentences,
                           ignore_tags, non_splitting_tags, splitting_tags (names,
                           comma-separated or a list), outline_detection (0 | 1, a
                           boolean in JSON); header Authorization: DeepL-Auth-Key KEY
    GET|POST /v2/languages DeepL: ?type=source | target
    GET|POST /v2/usage     DeepL: characters translated since the server started

Each takes JSON or a form (application/x-www-form-urlencoded, as libretranslatepy sends
it), answers in its protocol's shapes and status codes (a route raises `ServeError`, which
the app answers in the shape of the API its path is on: `refusal`), checks its key and its
languages as `Protocols` says (the document routes too: `mtkit.serving.documents`), and
translates through the same
path as /v1/translate: the server's batcher (`mtkit.serving.scheduler.Batcher`) under the
session every surface uses (`mtkit.engines.session.Session`: sentences split and joined, markup
carried through), with the same limits and the same API key (`serve --api-key`: the
LibreTranslate routes take it as `api_key` or a Bearer header, DeepL's as its
`DeepL-Auth-Key` header).
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from mtkit.core.errors import UserError
from mtkit.core.langid import LangIdError, base, detect_scored
from mtkit.core.languages import bilingual_pair, directions
from mtkit.core.textio import lone_surrogate, read_json
from mtkit.core.translation import Translation
from mtkit.documents.elements import PLAIN, MarkupRules
from mtkit.serving.scheduler import ServeError

NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "ca": "Catalan", "cs": "Czech", "da": "Danish",
    "de": "German", "el": "Greek", "en": "English", "es": "Spanish", "et": "Estonian",
    "fi": "Finnish", "fr": "French", "ga": "Irish", "he": "Hebrew", "hi": "Hindi",
    "hu": "Hungarian", "id": "Indonesian", "it": "Italian", "ja": "Japanese", "ko": "Korean",
    "lt": "Lithuanian", "lv": "Latvian", "nb": "Norwegian Bokmål", "nl": "Dutch",
    "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sk": "Slovak",
    "sl": "Slovenian", "sv": "Swedish", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}  # fmt: skip
MAX_ALTERNATIVES = 16
# LibreTranslate's default frontendTimeout: how long its web page waits after a keystroke
# before it translates (ms). mtkit's own page translates on a button, so it has none.
FRONTEND_TIMEOUT_MS = 500


@dataclass
class Protocols:
    """What the routes need of the service (`mtkit.serving.app.Service`)."""

    service: object
    api_key: str | None
    characters: int = 0  # translated since the server started (DeepL's /v2/usage)

    @property
    def pairs(self) -> list[tuple[str, str]]:
        data = self.service.translator.config.data
        return directions(data) or [bilingual_pair(data)]

    def sources(self) -> list[str]:
        return sorted({s for s, _ in self.pairs})

    def languages(self) -> list[str]:
        """Every language the model reads or writes."""
        return sorted({lang for pair in self.pairs for lang in pair})

    def targets(self, source: str | None = None) -> list[str]:
        return sorted({t for s, t in self.pairs if source is None or s == source})

    def tgt_lang(self, target: str) -> str | None:
        """The language a session translates into for `target`: a multilingual model's
        `target`; None for a bilingual model (it has one)."""
        return target if len(self.targets()) > 1 else None

    def libretranslate_key(self, request: Request, given: dict) -> None:
        """403 unless the request's `api_key` field (in `given`) or Bearer header opens
        the server (LibreTranslate's routes)."""
        key = self.api_key
        if not (
            key_ok(given.get("api_key"), key) or key_ok(credentials(request, ("bearer",)), key)
        ):
            raise ServeError(403, "Invalid API key")

    def libretranslate_languages(
        self, given: dict, texts: list[str] | None = None
    ) -> tuple[str, str, list | None]:
        """LibreTranslate's `source` (a code, or auto) and `target` of a request's fields
        (`given`), checked against the model's pairs (400 in LibreTranslate's words where
        one is missing or not supported), and where `source` is auto, what was detected:
        each of `texts`' languages and probabilities among the model's source languages,
        the source the one found (the first source language where they differ). A file
        (`texts` None) is read in the model's first source language, detected is None."""
        for name in ("source", "target"):
            if given.get(name) in (None, ""):
                raise ServeError(400, f"Invalid request: missing {name} parameter")
        source, target = base(str(given["source"])), base(str(given["target"]))
        detected = None
        if source == "auto" and texts is not None:
            detected = _detect(texts, self.sources())
            found = {lang for lang, _ in detected if lang}
            source = found.pop() if len(found) == 1 else self.sources()[0]
        elif source == "auto":
            source = self.sources()[0]
        elif source not in self.sources():
            raise ServeError(400, f"{source} is not supported")
        if target not in self.targets(source):
            raise ServeError(400, f"{target} is not supported")
        return source, target, detected

    def deepl_key(self, request: Request) -> None:
        """403 unless the request's `Authorization: DeepL-Auth-Key KEY` (or Bearer) header
        opens the server (DeepL's routes)."""
        if not key_ok(credentials(request, ("deepl-auth-key", "bearer")), self.api_key):
            raise ServeError(403, "Authorization failure, check auth_key")

    def deepl_languages(self, given: dict) -> tuple[str | None, str]:
        """DeepL's `source_lang` (None where not given) and `target_lang` of a request's
        fields (`given`), checked against the model's pairs (400 in DeepL's words where
        target_lang is missing or either is not supported)."""
        if not given.get("target_lang"):
            raise ServeError(400, "Parameter 'target_lang' not specified.")
        target = base(str(given["target_lang"]))
        source = base(str(given["source_lang"])) if given.get("source_lang") else None
        if source is not None and source not in self.sources():
            raise ServeError(400, "Value for 'source_lang' not supported.")
        if target not in self.targets(source):
            raise ServeError(400, "Value for 'target_lang' not supported.")
        return source, target

    async def translate(
        self,
        request: Request,
        texts: list[str],
        format: str,
        split: bool,
        target: str,
        nbest: int,
        markup: MarkupRules = PLAIN,
    ) -> list[Translation]:
        """`texts` translated as every route translates (`Service.translated`), a markup
        format's elements judged with `markup` too; a ServeError (status and message)
        for what cannot be (options, markup, limits)."""
        service = self.service
        service.limits.check(texts)
        opts = service.options_for(nbest)  # (a mistake: the app's handler answers it)
        found = await service.translated(
            request,
            texts,
            opts,
            tgt_lang=self.tgt_lang(target),
            format=format,
            split=split,
            markup=markup,
        )
        if found is None:  # the client left while it waited: no one to answer
            raise ServeError(400, "the client disconnected")
        self.characters += sum(map(len, texts))
        return found


def refusal(
    path: str, status: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """A refusal in the shape of the API that `path` is on: DeepL's {"message"} under
    /v2/, {"error"} elsewhere (LibreTranslate's, and /v1's)."""
    key = "message" if (path + "/").startswith("/v2/") else "error"
    return JSONResponse({key: message}, status_code=status, headers=headers)


def key_ok(given: object, api_key: str | None) -> bool:
    """Whether `given` opens a server with `api_key` (anything does where it has none; a
    key that is not text never does)."""
    return not api_key or (
        isinstance(given, str)
        and hmac.compare_digest(given.encode("utf-8", "surrogatepass"), api_key.encode())
    )


def credentials(request: Request, schemes: tuple[str, ...]) -> str | None:
    """The key of the request's `Authorization: SCHEME KEY` header where SCHEME is one of
    `schemes` (lower case: a scheme's case does not matter, RFC 7235), whatever the
    whitespace around and between them; None otherwise. Every route reads its key here."""
    parts = request.headers.get("authorization", "").split(None, 1)
    return parts[1].strip() if len(parts) == 2 and parts[0].lower() in schemes else None


async def fields(request: Request) -> dict:
    """A request's fields: its query, and its body as JSON or as a form (a field given
    more than once is a list). A ServeError (400) for a body that is neither, or that is
    not UTF-8."""
    out = _form(request.scope.get("query_string", b""), "query")
    raw = await request.body()
    if not raw.strip():
        return out
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/x-www-form-urlencoded":
        return {**out, **_form(raw, "body")}
    if kind.startswith("multipart/"):
        raise ServeError(400, "send the fields as JSON or as a urlencoded form")
    try:
        data = read_json(_utf8(raw, "body"))
    except ValueError as e:
        raise ServeError(400, f"the body is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ServeError(400, "the body must be a JSON object")
    out.update(data)
    return out


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ServeError(400, f"the {what} is not UTF-8 (byte {e.start})") from None


def _form(raw: bytes, what: str) -> dict:
    """A urlencoded form's fields (a field given more than once is a list); 400 where
    it is not UTF-8, in its bytes or in what they percent-encode (never a U+FFFD
    translated in its place)."""
    try:
        found = parse_qs(_utf8(raw, what), keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise ServeError(400, f"the {what} is not UTF-8 (a percent-encoded byte)") from None
    return {key: values if len(values) > 1 else values[0] for key, values in found.items()}


def _texts(value, name: str) -> tuple[list[str], bool]:
    """A text field as a list of texts, and whether it was one text."""
    one = isinstance(value, str)
    texts = [value] if one else value
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ServeError(400, f"Invalid request: {name} must be text or a list of texts")
    for t in texts:
        bad = lone_surrogate(t)
        if bad:
            raise ServeError(400, f"Invalid request: {name}: {bad}")
    return texts, one


def _int(value, name: str, low: int, high: int) -> int:
    """A whole number field: an integer, or up to 18 ASCII digits in a form (never a
    float, a boolean, or what only `str.isdigit` calls digits, such as "²"); 400
    otherwise."""
    if isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]{1,18}\s*", value):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ServeError(400, f"Invalid request: {name} must be a whole number")
    if not low <= value <= high:
        raise ServeError(400, f"Invalid request: {name} must be from {low} to {high}")
    return value


def _get_and_post(app: FastAPI, path: str, tag: str):
    """A route that answers GET and POST alike (as the clients send either), each with an
    operation of its own in the OpenAPI page."""

    def route(function):
        for method in ("GET", "POST"):
            app.add_api_route(
                path,
                function,
                methods=[method],
                tags=[tag],
                name=f"{function.__name__}_{method.lower()}",
                operation_id=f"{tag.lower()}_{path.strip('/').replace('/', '_')}_{method.lower()}",
            )
        return function

    return route


def add_routes(app: FastAPI, service, api_key: str | None) -> Protocols:
    """Add the LibreTranslate and DeepL routes to `app`."""
    protocols = Protocols(service, api_key)
    _libretranslate(app, protocols)
    _deepl(app, protocols)
    return protocols


# ---- LibreTranslate ------------------------------------------------------------------------


def _libretranslate(app: FastAPI, protocols: Protocols) -> None:
    @app.post("/translate", tags=["LibreTranslate"])
    async def translate(request: Request):
        """LibreTranslate's translate: q (text or a list), source (a code or auto),
        target, format (text or html), alternatives, api_key."""
        given = await fields(request)
        protocols.libretranslate_key(request, given)
        if given.get("q") is None:  # (an empty q is translated: as "")
            raise ServeError(400, "Invalid request: missing q parameter")
        texts, one = _texts(given["q"], "q")
        fmt = str(given.get("format", "text"))
        if fmt not in ("text", "html"):
            raise ServeError(400, "Invalid request: format must be text or html")
        alternatives = _int(given.get("alternatives", 0), "alternatives", 0, MAX_ALTERNATIVES)
        if alternatives and fmt != "text":  # (as `translate --nbest --format html`)
            raise ServeError(
                400,
                f"Invalid request: alternatives are for text; format {fmt} writes a document",
            )
        _, target, detected = protocols.libretranslate_languages(given, texts)
        found = await protocols.translate(request, texts, fmt, True, target, alternatives + 1)
        out: dict = {"translatedText": [t.text for t in found]}
        if alternatives:
            out["alternatives"] = [[a.text for a in t.alternatives] for t in found]
        if detected is not None:
            out["detectedLanguage"] = [
                {"confidence": round(100 * p, 1), "language": lang} for lang, p in detected
            ]
        if one:
            out = {k: v[0] for k, v in out.items()}
        return out

    @_get_and_post(app, "/languages", "LibreTranslate")
    async def languages() -> list:
        """LibreTranslate's languages: every language the model reads or writes, each with
        what it translates into (none for one the model only writes), as LibreTranslate
        lists every language it has loaded."""
        return [
            {"code": lang, "name": NAMES.get(lang, lang), "targets": protocols.targets(lang)}
            for lang in protocols.languages()
        ]

    @app.get("/frontend/settings", tags=["LibreTranslate"])
    async def frontend_settings() -> dict:
        """LibreTranslate's settings for its web page and its clients: the characters a
        request may hold, whether a key is needed, the suffixes of the files it
        translates (`mtkit.serving.documents`), no suggestions, and the languages a page
        starts with (the model's first source language and its first target)."""
        source = protocols.sources()[0]
        target = protocols.targets(source)[0]
        keyed = protocols.api_key is not None
        return {
            "charLimit": protocols.service.limits.max_chars,
            "frontendTimeout": FRONTEND_TIMEOUT_MS,
            "apiKeys": keyed,
            "keyRequired": keyed,
            "suggestions": False,
            "filesTranslation": True,
            "supportedFilesFormat": protocols.service.documents.suffixes(),
            "language": {
                "source": {"code": source, "name": NAMES.get(source, source)},
                "target": {"code": target, "name": NAMES.get(target, target)},
            },
        }

    @app.post("/detect", tags=["LibreTranslate"])
    async def detect(request: Request):
        """LibreTranslate's detect: q's language and confidence (0-100), by py3langid."""
        given = await fields(request)
        protocols.libretranslate_key(request, given)
        if given.get("q") in (None, ""):
            raise ServeError(400, "Invalid request: missing q parameter")
        texts, _ = _texts(given["q"], "q")
        protocols.service.limits.check(texts)
        found = _detect([" ".join(texts)], None)
        return [{"confidence": round(100 * p, 1), "language": lang} for lang, p in found]


def _detect(texts: list[str], among: list[str] | None) -> list:
    """Each text's language and probability (py3langid) `among` those languages (None:
    all it knows); 400 where py3langid is not installed."""
    # `source auto` detects among the model's source languages (one: every text is in
    # it, at 100) and refuses none for the language found among all 97: short texts are
    # not told apart there (of multi30k's English test and val lines cut to 4-5 words,
    # "A man in a karate" is Hausa at 0.99999), so no confidence refuses German yet
    # never the model's own language.
    try:
        return detect_scored(texts, among)
    except LangIdError as e:
        raise ServeError(400, f"source auto needs language identification: {e}") from None


# ---- DeepL API v2 --------------------------------------------------------------------------


def _deepl_markup(given: dict) -> MarkupRules:
    """DeepL's tag options of a request (`MarkupRules.checked`); 400 naming the field
    whose value is wrong."""
    try:
        return MarkupRules.checked(**{name: given.get(name) for name in DEEPL_MARKUP}, spell=str)
    except UserError as e:
        field = getattr(e, "option", "")
        raise ServeError(400, f"Value for '{field}' not supported: {e.line()}") from None


DEEPL_MARKUP = ("ignore_tags", "non_splitting_tags", "splitting_tags", "outline_detection")


def _deepl(app: FastAPI, protocols: Protocols) -> None:
    @app.post("/v2/translate", tags=["DeepL"])
    async def translate(request: Request):
        """DeepL's translate: text (a list), target_lang, source_lang, tag_handling
        (html or xml: each text a document or a fragment of one), split_sentences (0, 1
        or nonewlines), and for tag_handling, ignore_tags, non_splitting_tags,
        splitting_tags and outline_detection (`mtkit.documents.elements.MarkupRules`)."""
        protocols.deepl_key(request)
        given = await fields(request)
        if given.get("text") in (None, "", []):
            raise ServeError(400, "Parameter 'text' not specified.")
        source, target = protocols.deepl_languages(given)
        texts, _ = _texts(given["text"], "text")
        tags = given.get("tag_handling")
        if tags not in (None, "", "html", "xml"):
            raise ServeError(400, "Value for 'tag_handling' not supported.")
        split = str(given.get("split_sentences", "1"))
        if split not in ("0", "1", "nonewlines"):
            raise ServeError(400, "Value for 'split_sentences' not supported.")
        markup = _deepl_markup(given) if tags else PLAIN  # (without: DeepL ignores them)
        found = await protocols.translate(
            request, texts, tags or "text", split != "0", target, 1, markup
        )
        detected = (source or protocols.sources()[0]).upper()
        return {
            "translations": [
                {
                    "detected_source_language": detected,
                    "text": t.text,
                    "billed_characters": len(source_text),
                }
                for t, source_text in zip(found, texts, strict=True)
            ]
        }

    @_get_and_post(app, "/v2/languages", "DeepL")
    async def languages(request: Request):
        """DeepL's languages: ?type=source (the default) or target."""
        protocols.deepl_key(request)
        kind = (await fields(request)).get("type", "source")
        if kind not in ("source", "target"):
            raise ServeError(400, "Value for 'type' not supported.")
        if kind == "target":
            return [
                {"language": t.upper(), "name": NAMES.get(t, t), "supports_formality": False}
                for t in protocols.targets()
            ]
        return [{"language": s.upper(), "name": NAMES.get(s, s)} for s in protocols.sources()]

    @_get_and_post(app, "/v2/usage", "DeepL")
    async def usage(request: Request):
        """DeepL's usage: the characters translated since the server started."""
        protocols.deepl_key(request)
        return {"character_count": protocols.characters, "character_limit": 10**12}
