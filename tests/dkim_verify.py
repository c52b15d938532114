#!/usr/bin/env python3
"""Verifies every DKIM-Signature of a message with dkimpy, an independent
implementation, for tests/dkim.rs.

    dkim_verify.py MESSAGE KEYGEN_OUTPUT...

Each KEYGEN_OUTPUT is what `smtp-once dkim-keygen` printed; the TXT records
in them are the only DNS this verifier sees (dkimpy's `dnsfunc` hook).
Prints one line per signature (`pass d=... s=...` or `fail ...`) and exits
0 only if there is at least one signature and every one verifies.
Needs `pip3 install dkimpy==1.1.8 pynacl==1.6.2` (PyNaCl for Ed25519).
"""

import re
import sys

import dkim
import nacl  # noqa: F401  (Ed25519 in dkimpy; fail here, not per signature)

RECORD = re.compile(r"(\S+)\. IN TXT \((.*?)\)", re.S)


def records(paths):
    out = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        found = RECORD.findall(text)
        if not found:
            sys.exit(f"{path}: no TXT record in it")
        for name, strings in found:
            value = "".join(re.findall(r'"([^"]*)"', strings))
            out[name.lower() + "."] = value.encode()
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    with open(sys.argv[1], "rb") as f:
        message = f.read()
    txt = records(sys.argv[2:])

    def dnsfunc(name, timeout=5):
        return txt.get(name.decode().lower())

    count = len(re.findall(rb"(?im)^dkim-signature:", message.split(b"\r\n\r\n", 1)[0]))
    if count == 0:
        print("no DKIM-Signature")
        return 1
    failed = 0
    d = dkim.DKIM(message, minkey=2048)
    for i in range(count):
        try:
            ok, why = d.verify(idx=i, dnsfunc=dnsfunc), ""
        except dkim.DKIMException as e:
            ok, why = False, f" ({e})"
        tags = d.signature_fields or {}
        who = f"d={tags.get(b'd', b'?').decode()} s={tags.get(b's', b'?').decode()}"
        print(("pass " if ok else "fail ") + who + why)
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
