"""XLIFF 1.2 and 2.0 files of a few hundred units with mixed inline codes, translated as
`mtkit translate --format xliff` translates them (issue 77's goal: 100% of translatable
units filled with their inline codes, read back by translate-toolkit, everything else
byte for byte).

    python benchmarks/xliff.py [-m CKPT] [--units 400] [--seed 1] [--json]

Each file is generated (seeded): units of 2-7 chunks of test2016 words (a fixed word list
without the data), half of the chunks inside a code of a random kind (1.2: `g`, `x`, `bx`
and `ex`, `bpt`/`ept` around words, `ph` and `it` with native code, `mrk` of a term and
`mrk mtype="protected"`; 2.0: `pc`, `ph`, `sc`/`ec`, `sm`/`em`, `cp`, `mrk` and
`mrk translate="no"`), a note every 7th unit, a comment every 11th, every 13th unit
`translate="no"`, every 17th with a translator's target already written. With `-m` the
units are translated by that model (`mtkit.Translator`, `format="xliff"`); without it by
a fake translation (each text's words in reverse order in capitals, word i linked to
word n - 1 - i: every code must still come through, each pair in order).

Each output is read back with translate-toolkit and judged: the units that should get a
target and got one (with text), the units whose target holds exactly the source's
codes (the same (element, id) set, with each closing code after its opening one), the
kept units unchanged, and the file outside the new targets and attributes byte for byte
the input. Prints one row per version (and with --json one JSON object), with the
seconds taken; exits 1 where any figure falls short of all.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time

from lxml import etree

import mtkit
from mtkit.core.translation import Translation
from mtkit.documents.formats import translate_document

WORDS = (
    "a man in an orange hat starring at something two young guys with shaggy hair look at "
    "their hands while hanging out in the yard a little girl climbing into a wooden playhouse"
).split()
X1 = "urn:oasis:names:tc:xliff:document:1.2"
X2 = "urn:oasis:names:tc:xliff:document:2.0"
KINDS = {
    1: ["g", "x", "bxex", "bpt", "ph", "it", "mrk", "protected"],
    2: ["pc", "ph", "sc", "sm", "cp", "mrk", "protected"],
}


def code(kind: str | None, k: int, chunk: str, version: int) -> str:
    """`chunk` with a code of `kind` (None: none), numbered `k`."""
    if kind is None:
        return chunk
    return {
        "g": f'<g id="{k}">{chunk}</g>',
        "x": f'{chunk}<x id="{k}"/>',
        "bxex": f'<bx id="{k}" rid="r{k}"/>{chunk}<ex id="{k}e" rid="r{k}"/>',
        "bpt": f'<bpt id="{k}">&lt;b&gt;</bpt>{chunk}<ept id="{k}">&lt;/b&gt;</ept>',
        "ph": f'{chunk} <ph id="{k}">{{{k}}}</ph>' if version == 1 else f'{chunk} <ph id="{k}"/>',
        "it": f'<it id="{k}" pos="open">&lt;i&gt;</it>{chunk}',
        "mrk": f'<mrk mtype="term" mid="{k}">{chunk}</mrk>'
        if version == 1
        else f'<mrk id="m{k}" type="term">{chunk}</mrk>',
        "protected": f'<mrk mtype="protected" mid="{k}">{chunk}</mrk>'
        if version == 1
        else f'<mrk id="m{k}" translate="no">{chunk}</mrk>',
        "pc": f'<pc id="{k}">{chunk}</pc>',
        "sc": f'<sc id="{k}"/>{chunk}<ec startRef="{k}"/>',
        "sm": f'<sm id="s{k}"/>{chunk}<em startRef="s{k}"/>',
        "cp": f'{chunk}<cp hex="0001"/>',
    }[kind]


def generated(n: int, version: int, seed: int) -> str:
    """An XLIFF file of `n` units (see the module's docstring)."""
    rng = random.Random(seed)
    units = []
    for u in range(n):
        parts = []
        for k in range(1, rng.randint(2, 7) + 1):
            chunk = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
            kind = rng.choice(KINDS[version]) if rng.random() < 0.5 else None
            parts.append(code(kind, k, chunk, version))
        source = " ".join(parts) + "."
        no = ' translate="no"' if u % 13 == 5 else ""
        target = "<target>Schon übersetzt.</target>" if u % 17 == 3 else ""
        note = f"\n        <note>note {u}</note>" if u % 7 == 0 else ""
        comment = f"      <!-- unit {u} -->\n" if u % 11 == 0 else ""
        if version == 1:
            units.append(
                f'{comment}      <trans-unit id="{u}"{no}>\n        <source>{source}</source>'
                f"{target}{note}\n      </trans-unit>\n"
            )
        else:
            notes = f"\n      <notes><note>note {u}</note></notes>" if note else ""
            units.append(
                f'{comment}    <unit id="u{u}"{no}>{notes}\n      <segment>\n        '
                f"<source>{source}</source>{target}\n      </segment>\n    </unit>\n"
            )
    if version == 1:
        return (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<xliff version="1.2" xmlns="{X1}">\n'
            '  <file original="g.txt" source-language="en" datatype="plaintext">\n'
            "    <body>\n" + "".join(units) + "    </body>\n  </file>\n</xliff>\n"
        )
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<xliff version="2.0" xmlns="{X2}" '
        'srcLang="en">\n  <file id="f">\n' + "".join(units) + "  </file>\n</xliff>\n"
    )


def reversed_words(texts: list[str]) -> list[Translation]:
    out = []
    for text in texts:
        words = text.split()
        n = len(words)
        links = tuple((i, n - 1 - i) for i in range(n))
        target = " ".join(w.upper() for w in reversed(words))
        out.append(Translation(text, target, -1.0, -0.5, (), links))
    return out


OPENS = {1: {"ept": "bpt", "ex": "bx"}, 2: {"ec": "sc", "em": "sm"}}  # closing: opening


def codes(element) -> list[tuple[str, str | None]]:
    return sorted(
        (etree.QName(e).localname, e.get("id") or e.get("startRef") or e.get("mid"))
        for e in element.iterdescendants()
        if isinstance(e.tag, str)
    )


def in_order(element, version: int) -> bool:
    """Whether each closing code comes after the opening one it closes."""
    seen = set()
    for e in element.iterdescendants():
        if not isinstance(e.tag, str):
            continue
        name = etree.QName(e).localname
        key = e.get("rid") or (e.get("id") if version == 1 else e.get("startRef"))
        if name in OPENS[version].values():
            seen.add((name, e.get("rid") or e.get("id")))
        elif name in OPENS[version] and (OPENS[version][name], key) not in seen:
            return False
    return True


# What a translation adds: new targets, their marks, the target language
ADDED = re.compile(
    r"(?:\n[ \t]*)?<target state=\"needs-review-translation\" "
    r"state-qualifier=\"leveraged-mt\">.*?</target>| target-language=\"de\"| trgLang=\"de\""
    r"| state=\"translated\" subState=\"mtkit:mt\"|(?:\n[ \t]*)?<target>(?!Schon).*?</target>",
    re.S,
)


def judged(document: str, output: str, version: int) -> dict:
    """translate-toolkit's reading of `output`, against `document`."""
    if version == 1:
        from translate.storage.xliff import xlifffile as store
    else:
        from translate.storage.xliff2 import Xliff2File as store
    units = store.parsestring(output.encode("utf-8")).units
    ns = X1 if version == 1 else X2
    want = filled = same = kept = 0
    for unit in units:
        element = unit.xmlelement
        holder = element if version == 1 else element.getparent()
        target = element.find(f"{{{ns}}}target")
        translated_before = target is not None and target.text == "Schon übersetzt."
        if holder.get("translate") == "no" or translated_before:
            kept += target is None or translated_before
            continue
        want += 1
        filled += bool(unit.target)
        source = element.find(f"{{{ns}}}source")
        same += target is not None and codes(source) == codes(target) and in_order(target, version)
    skipped = sum(1 for u in range(len(units)) if u % 13 == 5 or u % 17 == 3)
    return {
        "units": len(units),
        "to_fill": want,
        "filled": filled,
        "codes_same": same,
        "kept": kept,
        "kept_expected": skipped,
        "rest_byte_for_byte": ADDED.sub("", output) == document,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", help="a checkpoint (default: a fake translation)")
    parser.add_argument("--units", type=int, default=400)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    translator = mtkit.Translator.load(args.model, device="cpu") if args.model else None
    rows = {}
    for version in (1, 2):
        document = generated(args.units, version, args.seed)
        start = time.perf_counter()
        if translator is not None:
            (result,) = translator.translate([document], format="xliff")
            output = result.text
        else:
            output = translate_document(document, "xliff", reversed_words, "de").text
        seconds = time.perf_counter() - start
        rows[f"{version}.{'2' if version == 1 else '0'}"] = {
            **judged(document, output, version),
            "seconds": round(seconds, 2),
        }
    print(
        f"{'XLIFF':6} {'units':>6} {'to fill':>8} {'filled':>7} {'codes same':>11} "
        f"{'kept':>5} {'rest same':>10} {'seconds':>8}"
    )
    for name, r in rows.items():
        print(
            f"{name:6} {r['units']:>6} {r['to_fill']:>8} {r['filled']:>7} {r['codes_same']:>11} "
            f"{r['kept']:>5} {str(r['rest_byte_for_byte']):>10} {r['seconds']:>8}"
        )
    if args.json:
        print(json.dumps({"model": args.model or "fake (reversed words)", **rows}))
    ok = all(
        r["filled"] == r["codes_same"] == r["to_fill"]
        and r["kept"] == r["kept_expected"]
        and r["rest_byte_for_byte"]
        for r in rows.values()
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
