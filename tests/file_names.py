"""File names as programs and shells may make them, for property tests (tests/sandbox/test_copy_names.py,
tests/sandbox_api/test_run_file_names.py): any bytes, control characters, backslashes and '%',
NFC/NFD/NFKC/NFKD spellings, and names near and past the file system's 255 bytes."""

from __future__ import annotations

import unicodedata

from hypothesis import strategies as st

_ACCENTED = st.text(st.sampled_from("aeé\u0301üñÅ\u212bﬁ"), min_size=1, max_size=8)
FILE_NAMES = st.one_of(
    st.binary(min_size=1, max_size=40),
    st.text(st.sampled_from("ab.-_ \n\t\r\x1b\x7f\\%2eé€😀\u202e"), min_size=1, max_size=20).map(str.encode),
    st.tuples(_ACCENTED, st.sampled_from(["NFC", "NFD", "NFKC", "NFKD"]))
      .map(lambda pair: unicodedata.normalize(pair[1], pair[0]).encode()),
    st.integers(240, 300).map(lambda n: b"n" * n),
).map(lambda raw: raw.replace(b"/", b"_").replace(b"\0", b"_")).filter(lambda raw: raw not in (b".", b"..", b".git"))
