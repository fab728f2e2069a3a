"""Real text in, segments out, segments back into the document: sentence splitting and
joining, markup (HTML, XML) with its tags carried through alignments, subtitles (srt),
gettext catalogues (po), and placeholders kept as they are."""
