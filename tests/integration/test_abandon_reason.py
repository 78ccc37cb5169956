"""What a builder of derived weights says when it gives up (ABANDON's
reason) reaches every worker that waited, in their ERROR text, which
PROTOCOL.md says is UTF-8: it is escaped there as the log escapes it.
Before, only C0 controls and DEL became '?', so a builder could send
invalid UTF-8, bidi overrides and C1 controls (U+009B is CSI) to other
workers' terminals (review 173, F12)."""
import struct

from test_derived import ABANDON, ERRNO, ERROR, RELEASE_OK, building_with_a_waiter, closing
from test_derived import derived  # noqa: F401 (the fixture, used by name)
from test_regressions import start  # noqa: F401 (the fixture derived uses)

BIDI_AND_C1 = [chr(c) for c in range(0x80, 0xa0)] + \
    [chr(c) for c in list(range(0x202a, 0x202f)) + list(range(0x2066, 0x206a))]


def test_an_abandon_reason_reaches_waiters_as_printable_utf8(derived):
    d, a, b, r = building_with_a_waiter(derived)
    reason = b"\xff\xfe\x1b[31mred \xe2\x80\xae rlo \xc2\x9b csi \xe2\x81\xa6 isolate " + \
        "caf\u00e9 \u4e2d".encode()
    a.send(ABANDON, struct.pack("<Q", r["token"]) + reason)
    assert closing(a.reply())["type"] == RELEASE_OK
    mtype, _, payload, fds = b.receive()
    assert mtype == ERROR and not fds, payload
    (code,) = struct.unpack_from("<i", payload)
    assert code == ERRNO["ECANCELED"], payload
    text = payload[4:].decode("utf-8")  # strict: raises on invalid UTF-8
    assert not [ch for ch in text if ord(ch) < 0x20 or ch == "\x7f" or ch in BIDI_AND_C1], \
        ascii(text)
    # Escaped as the log escapes it; printable characters kept as they are.
    assert "failed: \\xff\\xfe\\x1b[31mred \\u202e rlo \\u009b csi \\u2066 isolate " \
        "caf\u00e9 \u4e2d" in text, ascii(text)
