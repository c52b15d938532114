#!/usr/bin/env python3
"""Runs the examples in README.md and docs/*.md as written, against a demo
daemon on the example config, and compares what they print with what the
docs show (issue 21, item 5).

  scripts/doc-examples.py [--bin target/debug/smtp-once] [FILE.md ...]

A shell block is run when the line before its opening fence is

    <!-- example -->

Blocks run in document order, one bash each (`set -eo pipefail`), in one
scratch directory per document holding a copy of config.example.toml and
certs/, with a fresh daemon started from that config (so `data/` and
`data/outbox/` are the example's). `smtp-once` on PATH is the binary under
test; `API` and `TOKEN` are the example config's HTTP address and demo API
token. A block fails when it exits non-zero.

When a block after a run block (and before the next) is preceded by

    <!-- output -->

its lines are the output the docs promise (after `<!-- log -->`, the daemon's
log lines, timestamps left out): each non-empty line must appear,
in order, in what the block printed (stdout and stderr), after both sides
have had queue ids, dates and `size=` figures replaced by placeholders. A `...` inside an expected line matches
anything; a line that is only `...` matches nothing in particular.

Exits 1 listing every failure. CI runs it after the tests (`.ci/run`).
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = "<!-- example -->"
OUTPUT = "<!-- output -->"
LOG = "<!-- log -->"
KINDS = {RUN: "run", OUTPUT: "output", LOG: "log"}
# The example config's [http] listener and its demo token (the config keeps
# only the token's SHA-256, as for any account).
API = "http://127.0.0.1:8025"
TOKEN = "so_demo_token_for_the_example_config_only"
QUEUE_ID = re.compile(r"\b[0-9A-HJKMNP-TV-Z]{15}\b")
# What differs from run to run: dates (RFC 5322 and RFC 3339), sizes.
DATE = re.compile(
    r"\b\w{3}, \d{1,2} \w{3} \d{4} \d\d:\d\d:\d\d [+-]\d{4}\b"
    r"|\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"
)
SIZE = re.compile(r"\bsize(=|:\s+)\d+")


def blocks(path):
    """(line number, kind, text) of each marked block: kind is run or output."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        marker = lines[i].strip()
        if marker in KINDS and i + 1 < len(lines) and lines[i + 1].startswith("```"):
            start = i + 2
            end = start
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            kind = KINDS[marker]
            out.append((i + 2, kind, "\n".join(lines[start:end])))
            i = end + 1
            continue
        i += 1
    return out


def normal(text):
    text = QUEUE_ID.sub("<ID>", text)
    text = DATE.sub("<DATE>", text)
    return SIZE.sub(lambda m: "size" + m.group(1).strip() + "<N>", text)


def matches(expected, actual):
    """Whether every expected line appears, in order, in the actual output."""
    got = [normal(l).strip() for l in actual.splitlines()]
    at = 0
    for want in (normal(l).strip() for l in expected.splitlines()):
        if not want or want == "...":
            continue
        parts = [p.strip() for p in want.split("...")]
        while at < len(got):
            line, pos, ok = got[at], 0, True
            for p in parts:
                found = line.find(p, pos)
                if found < 0:
                    ok = False
                    break
                pos = found + len(p)
            at += 1
            if ok:
                break
        else:
            return f"expected line not found (in order): {want!r}"
    return None


class Daemon:
    def __init__(self, binary, work):
        self.log = open(os.path.join(work, "daemon.log"), "w+")
        self.proc = subprocess.Popen(
            [binary, "serve", "--config", "config.example.toml"],
            cwd=work, stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 30
        while time.time() < deadline:
            self.log.seek(0)
            if "smtp-once http on" in self.log.read():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.log.seek(0)
        raise RuntimeError("the demo daemon did not start:\n" + self.log.read()[-3000:])

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run_document(path, binary):
    found = blocks(path)
    if not any(kind == "run" for _, kind, _ in found):
        return 0, []
    work = tempfile.mkdtemp(prefix="smtp-once-doc-")
    failures = []
    try:
        shutil.copy(os.path.join(ROOT, "config.example.toml"), work)
        shutil.copytree(os.path.join(ROOT, "certs"), os.path.join(work, "certs"))
        shims = os.path.join(work, "bin")
        os.mkdir(shims)
        os.symlink(os.path.abspath(binary), os.path.join(shims, "smtp-once"))
        env = dict(os.environ, PATH=shims + os.pathsep + os.environ["PATH"], API=API, TOKEN=TOKEN)
        daemon = Daemon(binary, work)
        ran = 0
        last_output = None
        try:
            for line, kind, text in found:
                where = f"{os.path.relpath(path, ROOT)}:{line}"
                if kind == "log":
                    # The daemon's log so far, without the timestamps.
                    time.sleep(1.5)  # the worker's lines follow the acceptance
                    daemon.log.seek(0)
                    logged = "\n".join(
                        l.split(" ", 1)[-1] for l in daemon.log.read().splitlines()
                    )
                    problem = matches(text, logged)
                    if problem:
                        failures.append(f"{where}: {problem}\n--- the daemon logged:\n{logged}")
                    continue
                if kind == "output":
                    if last_output is None:
                        failures.append(f"{where}: an output block with no example before it")
                        continue
                    problem = matches(text, last_output)
                    if problem:
                        failures.append(f"{where}: {problem}\n--- the example printed:\n{last_output}")
                    continue
                ran += 1
                result = subprocess.run(
                    ["bash", "-c", "set -eo pipefail\n" + text],
                    cwd=work, env=env, capture_output=True, text=True, timeout=120,
                )
                last_output = result.stdout + result.stderr
                if result.returncode != 0:
                    failures.append(
                        f"{where}: exit {result.returncode}\n--- the example:\n{text}\n"
                        f"--- it printed:\n{last_output}"
                    )
        finally:
            daemon.stop()
        return ran, failures
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/debug/smtp-once"))
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    files = a.files or [os.path.join(ROOT, "README.md")] + sorted(
        os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md")
    )
    total, failures = 0, []
    for path in files:
        ran, failed = run_document(path, a.bin)
        total += ran
        failures += failed
        if ran:
            print(f"{os.path.relpath(path, ROOT)}: {ran} examples, {len(failed)} failed")
    for f in failures:
        print("\nFAILED " + f, file=sys.stderr)
    print(f"{total} examples run, {len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
