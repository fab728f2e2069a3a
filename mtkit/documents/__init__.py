"""Real text in, segments out, segments back into the document: sentence splitting and
joining, markup (HTML, XML documents and fragments) with its tags carried through
alignments, which elements are inline or blocks by the standards (`elements`), subtitles
(srt), gettext catalogues (po), and placeholders kept as they are."""
