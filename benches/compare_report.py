#!/usr/bin/env python3
"""The result table of benches/compare.sh.

Reads the per-run TSV that compare.sh writes (argument 1) and, from the
environment, the description of the run (MACHINE, VERSIONS_TEXT, LOAD_DESC,
ROUNDS, SIZE, CONNS, VERIFY_TEXT, SKIPPED_TEXT, MISMATCH_TEXT, FAILED_TEXT,
MARKDOWN=1 for a README-ready table, RELAY_CONNS).

The relay peers (smtp-once-relay, postfix-relay) get a table of their own:
acceptance while relaying, end to end, and what their sinks received, next
to the accept-only run of the same server in the same round.

Ratios are "smtp-once / peer": computed per round (the runs of one round are
minutes apart at most, so the machine's drift cancels out) and the median
over rounds is shown.
"""

import csv
import datetime
import os
import statistics
import sys

ORDER = ["smtp-once", "smtp-once-pg", "smtp-once-pg2", "postfix", "postfix-hold", "haraka", "smtp-sink", "smtp-sink-dump"]
LABEL = {
    "smtp-once": "smtp-once",
    "smtp-once-pg": "smtp-once, PostgreSQL store, one node",
    "smtp-once-pg2": "smtp-once, PostgreSQL store, two nodes (the load split between them)",
    "postfix": "Postfix (`defer_transports = smtp`)",
    "postfix-hold": "Postfix, every message on hold",
    "haraka": "Haraka + queue plugin that fsyncs",
    "smtp-sink": "Postfix `smtp-sink` (stores nothing: the protocol ceiling)",
    "smtp-sink-dump": "`smtp-sink -D`, as the relay runs' next hop (the end-to-end ceiling)",
}
PLAIN_LABEL = {
    "smtp-once": "smtp-once",
    "smtp-once-pg": "smtp-once-pg",
    "smtp-once-pg2": "smtp-once-pg2",
    "postfix": "postfix",
    "postfix-hold": "postfix-hold",
    "haraka": "haraka",
    "smtp-sink": "smtp-sink",
    "smtp-sink-dump": "smtp-sink-dump",
}
# relay peer -> the accept-only peer of the same server
RELAY_OF = {"smtp-once-relay": "smtp-once", "postfix-relay": "postfix"}
RELAY_LABEL = {"smtp-once-relay": "smtp-once", "postfix-relay": "Postfix"}


def env_lines(name):
    return [l for l in os.environ.get(name, "").splitlines() if l.strip()]


def fmt_rate(x):
    return f"{x:,.0f}"


def fmt_ms(x):
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def fmt_ratio(x):
    if x is None:
        return "-"
    return f"{x:.2f}x" if x < 10 else f"{x:.1f}x"


def main():
    rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
    runs = [r for r in rows if r["round"] != "warmup"]
    markdown = os.environ.get("MARKDOWN") == "1"
    conns = [c for c in os.environ.get("CONNS", "").split()]
    if not conns:
        conns = sorted({r["conns"] for r in runs}, key=int)
    peers = [p for p in ORDER if any(r["peer"] == p for r in runs)]
    durable = {r["peer"]: r["durable"] for r in rows}

    # (peer, conns) -> {round: row}
    by = {}
    for r in runs:
        by.setdefault((r["peer"], r["conns"]), {})[r["round"]] = r

    stats = {}
    for (peer, c), rounds in by.items():
        rates = [float(r["msgs_per_sec"]) for r in rounds.values()]
        ratios = []
        ours = by.get(("smtp-once", c), {})
        for rnd, r in rounds.items():
            if rnd in ours and float(r["msgs_per_sec"]) > 0:
                ratios.append(float(ours[rnd]["msgs_per_sec"]) / float(r["msgs_per_sec"]))
        acked = sum(int(r["acked"]) for r in rounds.values())
        stored = (
            None
            if any(r["stored"] == "-" for r in rounds.values())
            else sum(int(r["stored"]) for r in rounds.values())
        )
        stats[(peer, c)] = {
            "n": len(rates),
            "median": statistics.median(rates),
            "min": min(rates),
            "max": max(rates),
            "p99": statistics.median(float(r["p99"]) for r in rounds.values()),
            "cpu": statistics.median(float(r["cpu_ms_per_msg"]) for r in rounds.values()),
            "ratio": statistics.median(ratios) if ratios else None,
            "acked": acked,
            "stored": stored,
            "other": sorted({r["other_replies"] for r in rounds.values()} - {"-"}),
            "errors": sum(int(r["errors"]) for r in rounds.values()),
        }

    now = datetime.datetime.now(datetime.timezone.utc)
    machine = os.environ.get("MACHINE", "")
    load = os.environ.get("LOAD_DESC", "")
    size = os.environ.get("SIZE", "4096")
    nrounds = os.environ.get("ROUNDS", "?")
    versions = env_lines("VERSIONS_TEXT")

    if markdown:
        print_markdown(now, machine, load, size, nrounds, versions, peers, conns, durable, stats)
    else:
        print_plain(now, machine, load, size, nrounds, versions, peers, conns, durable, stats)
    relay = relay_stats(by)
    if relay:
        print()
        if markdown:
            print_relay_markdown(now, size, nrounds, relay, stats)
        else:
            print_relay_plain(relay, stats)

    out = print
    verify = env_lines("VERIFY_TEXT")
    skipped = env_lines("SKIPPED_TEXT")
    mismatches = env_lines("MISMATCH_TEXT")
    failed = env_lines("FAILED_TEXT")
    bullet = "- " if markdown else "  "
    out("")
    out("Stored versus acknowledged (every 250 of the run, warm-up included):")
    for v in verify:
        out(f"{bullet}{v}")
    if skipped:
        out("")
        out("SKIPPED peers:")
        for s in skipped:
            out(f"{bullet}{s}")
    if failed:
        out("")
        out("FAILED runs (smtp-once bench exited non-zero):")
        for f in failed:
            out(f"{bullet}{f}")
    if mismatches:
        out("")
        out("!!! MISMATCHES: a peer did not store exactly what it acknowledged !!!")
        for m in mismatches:
            out(f"{bullet}{m}")


def per_round_ratio(num, den, key_num, key_den):
    """Median over the rounds both ran of num[key_num] / den[key_den]."""
    ratios = [
        float(num[r][key_num]) / float(den[r][key_den])
        for r in num
        if r in den and float(den[r][key_den]) > 0
    ]
    return statistics.median(ratios) if ratios else None


def relay_stats(by):
    """(relay peer, conns) -> figures, with ratios against the accept-only run."""
    out = {}
    for (peer, c), rounds in sorted(by.items(), key=lambda kv: (int(kv[0][1]), list(RELAY_OF).index(kv[0][0]) if kv[0][0] in RELAY_OF else 0)):
        if peer not in RELAY_OF:
            continue
        done = {k: r for k, r in rounds.items() if r["e2e_seconds"] not in ("timeout", "-")}
        accept = [float(r["msgs_per_sec"]) for r in rounds.values()]
        e2e = [float(r["e2e_msgs_per_sec"]) for r in done.values()]
        base = by.get((RELAY_OF[peer], c), {})
        ours = by.get(("smtp-once-relay", c), {})
        out[(peer, c)] = {
            "n": len(rounds),
            "accept": (statistics.median(accept), min(accept), max(accept)),
            "p99": statistics.median(float(r["p99"]) for r in rounds.values()),
            "e2e": (statistics.median(e2e), min(e2e), max(e2e)) if e2e else None,
            "timeouts": len(rounds) - len(done),
            "acked": sum(int(r["acked"]) for r in rounds.values()),
            "sink": sum(int(r["sink"]) for r in rounds.values()),
            "keys": sum(int(r["sink_keys"]) for r in rounds.values()),
            "relayed": sum(int(r["relayed"]) for r in rounds.values()),
            "cpu": statistics.median(float(r["cpu_ms_per_msg"]) for r in rounds.values()),
            # this server relaying / the same server accept-only, same round
            "accept_ratio": per_round_ratio(rounds, base, "msgs_per_sec", "msgs_per_sec"),
            "e2e_ratio": per_round_ratio(done, base, "e2e_msgs_per_sec", "msgs_per_sec"),
            # smtp-once end to end / this peer end to end, same round
            "vs": per_round_ratio(ours, done, "e2e_msgs_per_sec", "e2e_msgs_per_sec")
            if peer != "smtp-once-relay"
            else None,
        }
    return out


def fmt_range(t, n):
    if t is None:
        return "timeout"
    med, lo, hi = t
    return fmt_rate(med) + (f" ({fmt_rate(lo)}-{fmt_rate(hi)})" if n > 1 else "")


def print_relay_plain(relay, stats):
    print("End to end: each server relays to its own smtp-sink (smtp-once: smarthost mode;")
    print("Postfix: relayhost); a run lasts until the sink has every message and the server")
    print("has recorded it as relayed. accept: msgs/s while relaying; ratios per round, median.")
    head = (
        f"{'server':<10} {'conns':>5} {'accept msgs/s':<22} {'p99 ms':>7} {'end-to-end msgs/s':<22} "
        f"{'accept/acc-only':>15} {'e2e/acc-only':>12} {'smtp-once e2e/':>14} {'cpu ms/msg':>10}  "
        f"{'acked sink keys relayed':<24}"
    )
    print(head)
    print("-" * len(head))
    for (peer, c), s in relay.items():
        counts = f"{s['acked']} {s['sink']} {s['keys']} {s['relayed']}"
        ok = s["acked"] == s["sink"] == s["keys"] == s["relayed"] and not s["timeouts"]
        print(
            f"{RELAY_LABEL[peer]:<10} {c:>5} {fmt_range(s['accept'], s['n']):<22} {fmt_ms(s['p99']):>7} "
            f"{fmt_range(s['e2e'], s['n']):<22} {fmt_ratio(s['accept_ratio']):>15} "
            f"{fmt_ratio(s['e2e_ratio']):>12} {fmt_ratio(s['vs']):>14} {s['cpu']:>10.3f}  "
            f"{counts}{'' if ok else '  MISMATCH/TIMEOUT'}"
        )
    print(
        "acc-only: the same server's accept-only run at the same connection count;"
        " smtp-once e2e/: smtp-once's end-to-end rate over this server's."
    )


def print_relay_markdown(now, size, nrounds, relay, stats):
    print(
        f"End to end, measured {now:%Y-%m-%d} in the same run: each server relays to its own "
        f"Postfix `smtp-sink` over loopback (smtp-once in smarthost mode with `tls = \"none\"`, "
        f"Postfix with `relayhost`), and a run ends when the sink has every acknowledged "
        f"message and the server has recorded it as relayed. Accept-only is the same server "
        f"queueing without delivering, in the same rounds; \"while relaying\" is the "
        f"acceptance rate and p99 of the end-to-end run; ratios are per round, median."
    )
    print()
    print(
        "| server | conns | accept-only msgs/s | p99 ms | accepting while relaying msgs/s | p99 ms "
        "| end to end msgs/s | end to end ÷ accept-only | sink received (distinct keys) / acknowledged |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for (peer, c), s in relay.items():
        base = stats.get((RELAY_OF[peer], c))
        if base:
            acc_only = fmt_rate(base["median"]) + (
                f" ({fmt_rate(base['min'])}–{fmt_rate(base['max'])})" if base["n"] > 1 else ""
            )
            acc_p99 = fmt_ms(base["p99"])
        else:
            acc_only = acc_p99 = "—"
        e2e = fmt_range(s["e2e"], s["n"]).replace("-", "–")
        if peer == "smtp-once-relay":
            e2e = f"**{e2e}**"
        print(
            f"| {RELAY_LABEL[peer]} | {c} | {acc_only} | {acc_p99} "
            f"| {fmt_range(s['accept'], s['n']).replace('-', '–')} | {fmt_ms(s['p99'])} | {e2e} "
            f"| {fmt_ratio(s['e2e_ratio']).replace('x', '×')} "
            f"| {s['sink']:,} ({s['keys']:,}) / {s['acked']:,} |"
        )
    vs = [s["vs"] for (p, _c), s in relay.items() if p == "postfix-relay" and s["vs"]]
    if vs:
        print()
        print(f"smtp-once end to end ÷ Postfix end to end: {fmt_ratio(vs[0]).replace('x', '×')} (median of per-round ratios).")


def best_durable(peers, durable, stats, c):
    cands = [
        (stats[(p, c)]["median"], p)
        for p in peers
        # smtp-once's PostgreSQL rows are smtp-once too, not a peer to beat.
        if not p.startswith("smtp-once") and durable.get(p) == "yes" and (p, c) in stats
    ]
    return max(cands) if cands else None


def print_plain(now, machine, load, size, nrounds, versions, peers, conns, durable, stats):
    print(f"smtp-once compare.sh, {now:%Y-%m-%d %H:%M} UTC")
    print(f"machine:  {machine}")
    print(f"load:     {load}, {size}-byte messages with unique keys, {nrounds} interleaved round(s),")
    print("          persistent pipelining connections, plaintext, load generator on the same machine")
    for v in versions:
        print(f"version:  {v}")
    print()
    head = (
        f"{'peer':<13} {'fsync':>5} {'conns':>5} {'msgs/s':>9}  {'min-max':<17} "
        f"{'p99 ms':>7} {'cpu ms/msg':>10} {'smtp-once/peer':>14}  {'stored/acked':>13}"
    )
    print(head)
    print("-" * len(head))
    for c in conns:
        for p in peers:
            s = stats.get((p, c))
            if not s:
                continue
            stored = "-" if s["stored"] is None else f"{s['stored']}/{s['acked']}"
            mark = "" if s["stored"] is None or s["stored"] == s["acked"] else "  MISMATCH"
            extra = ""
            if s["other"] or s["errors"]:
                extra = f"  replies {' '.join(s['other']) or '-'}, errors {s['errors']}"
            print(
                f"{PLAIN_LABEL[p]:<13} {'yes' if durable[p] == 'yes' else 'no':>5} {c:>5} "
                f"{fmt_rate(s['median']):>9}  {fmt_rate(s['min']) + '-' + fmt_rate(s['max']):<17} "
                f"{fmt_ms(s['p99']):>7} {s['cpu']:>10.3f} {fmt_ratio(s['ratio']):>14}  {stored:>13}{mark}{extra}"
            )
        print()
    for c in conns:
        b = best_durable(peers, durable, stats, c)
        ours = stats.get(("smtp-once", c))
        if b and ours:
            print(
                f"c={c}: smtp-once {fmt_rate(ours['median'])}/s, best durable peer {b[1]} "
                f"{fmt_rate(b[0])}/s: {fmt_ratio(stats[(b[1], c)]['ratio'])} (median of per-round ratios)"
            )
    print(
        "msgs/s: median over rounds; p99: median of the rounds' p99 (end of data to reply);"
        " cpu ms/msg: whole machine, load generator included."
    )


def print_markdown(now, machine, load, size, nrounds, versions, peers, conns, durable, stats):
    print(
        f"Measured {now:%Y-%m-%d} with `benches/compare.sh` on {machine}; "
        f"{load}, {int(size) // 1024 if int(size) % 1024 == 0 else size}"
        f"{' KiB' if int(size) % 1024 == 0 else '-byte'} messages each with a unique idempotency key, "
        f"persistent pipelining connections, plaintext over loopback, the load generator "
        f"(`smtp-once bench`) on the same machine; {nrounds} rounds with the servers interleaved. "
        f"msgs/s is the median over rounds (min–max), p99 the median of the rounds' p99 "
        f"latency from the end of data to the reply, and the ratio is smtp-once's rate over "
        f"the server's in the same round (median over rounds). "
        + (
            "Every durable server's queue was counted after each run: it held exactly what "
            "it had acknowledged."
            if not env_lines("MISMATCH_TEXT")
            else "**Some servers did not store what they acknowledged: see below.**"
        )
    )
    if versions:
        print()
        print("Versions: " + "; ".join(versions) + ".")
    print()
    cols = ["server", "fsync before 250"]
    for c in conns:
        cols += [f"{c} connections: msgs/s", "p99 ms", "smtp-once ÷ server"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join(["---"] * 2 + ["--:"] * (3 * len(conns))) + "|")
    for p in peers:
        cells = [LABEL[p], "yes" if durable[p] == "yes" else "—"]
        for c in conns:
            s = stats.get((p, c))
            if not s:
                cells += ["—", "—", "—"]
                continue
            rate = fmt_rate(s["median"])
            if s["n"] > 1:
                rate += f" ({fmt_rate(s['min'])}–{fmt_rate(s['max'])})"
            if p == "smtp-once":
                rate = f"**{rate}**"
            ratio = "—" if p == "smtp-once" else fmt_ratio(s["ratio"]).replace("x", "×")
            cells += [rate, fmt_ms(s["p99"]), ratio]
        print("| " + " | ".join(cells) + " |")
    # msgs/s counts every final reply: say so when some were not 250.
    notes = [
        f"{LABEL[p]} at {c} connections: replies {' '.join(stats[(p, c)]['other']) or '-'}, "
        f"connection errors {stats[(p, c)]['errors']}"
        for p in peers
        for c in conns
        if (p, c) in stats and (stats[(p, c)]["other"] or stats[(p, c)]["errors"])
    ]
    if notes:
        print()
        print("Not every message got a 250 (msgs/s counts every final reply):")
        for n in notes:
            print(f"- {n}")


if __name__ == "__main__":
    main()
