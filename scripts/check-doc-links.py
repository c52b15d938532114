#!/usr/bin/env python3
"""Every relative markdown link in README.md and docs/*.md resolves: the file exists and,
when there is a #fragment, a heading with that GitHub slug exists in it."""
import os, re, sys, glob
root = sys.argv[1] if len(sys.argv) > 1 else '.'
os.chdir(root)
def slugs(path):
    out, seen, inblock = set(), {}, False
    for l in open(path):
        if l.startswith('```'): inblock = not inblock; continue
        if inblock: continue
        m = re.match(r'^(#{1,6})\s+(.*?)\s*$', l)
        if not m: continue
        s = m.group(2).strip().lower()
        s = re.sub(r'[^\w\- ]', '', s)   # drop punctuation (backticks, brackets, dots, parens, quotes)
        s = s.replace(' ', '-')
        n = seen.get(s, 0); seen[s] = n + 1
        out.add(s if n == 0 else f'{s}-{n}')
    return out
bad = 0; count = 0
files = ['README.md'] + sorted(glob.glob('docs/*.md'))
for f in files:
    text = open(f).read()
    # strip fenced code blocks
    text_nc = re.sub(r'```.*?```', '', text, flags=re.S)
    for m in re.finditer(r'\]\(([^)\s]+)\)', text_nc):
        target = m.group(1)
        if re.match(r'^[a-z]+:', target): continue  # http:, mailto:
        count += 1
        path, _, frag = target.partition('#')
        tpath = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
        if not os.path.exists(tpath):
            print(f'{f}: {target}: no such file {tpath}'); bad += 1; continue
        if frag:
            if not tpath.endswith('.md'):
                print(f'{f}: {target}: fragment on non-markdown'); bad += 1; continue
            if frag not in slugs(tpath):
                print(f'{f}: {target}: no heading #{frag} in {tpath}'); bad += 1
print(f'{count} relative links checked, {bad} broken')
sys.exit(1 if bad else 0)
