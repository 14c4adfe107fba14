#!/usr/bin/env python3
"""Summarises `ncu --page source --csv --print-source sass` (one kernel) into text: the
columns, the sum of every numeric column, the stall-sample totals by reason, the opcodes
weighted by samples, the 80 instructions with the most samples (their top reasons), and every
instruction with samples in address order (address, samples, top reason, SASS)."""
import csv, sys, collections

rows = list(csv.reader(open(sys.argv[1], newline='')))
hi = next(i for i, r in enumerate(rows) if any('Address' in c for c in r) and any('Source' in c for c in r))
head = rows[hi]
data = [r for r in rows[hi + 1:] if len(r) == len(head)]
print(f"{len(data)} rows; columns:")
for i, c in enumerate(head):
    print(f"  [{i}] {c}")

def num(x):
    try:
        return float(x.replace(',', ''))
    except ValueError:
        return None

numeric = [i for i in range(len(head)) if sum(1 for r in data if num(r[i]) is not None) > len(data) // 2]
src = next(i for i, c in enumerate(head) if c.strip() == 'Source')
addr = next(i for i, c in enumerate(head) if 'Address' in c)
samp = [i for i in numeric if 'Sampl' in head[i] and 'All' in head[i]] or [i for i in numeric if 'Sampl' in head[i]]
S = samp[0] if samp else None
reasons = [i for i in numeric if ('stall' in head[i].lower() or 'Stall' in head[i]) and i != S and 'Sampl' not in head[i]]
print("\ncolumn sums:")
for i in numeric:
    print(f"  {head[i]}: {sum(num(r[i]) or 0 for r in data):.0f}")
if S is None:
    sys.exit("no sampling column")
tot = sum(num(r[S]) or 0 for r in data)
print(f"\nsamples column: {head[S]} total {tot:.0f}")
print("\nstall reasons (sum over instructions):")
rs = sorted(((sum(num(r[i]) or 0 for r in data), head[i]) for i in reasons), reverse=True)
for v, n in rs:
    if v > 0:
        print(f"  {100 * v / max(tot, 1):6.2f} %  {v:10.0f}  {n}")
op = collections.Counter()
cnt = collections.Counter()
for r in data:
    o = r[src].split()
    o = [x for x in o if not x.startswith('@')]
    k = o[0] if o else '?'
    op[k] += num(r[S]) or 0
    cnt[k] += 1
print("\nopcodes by samples (static count):")
for k, v in op.most_common(40):
    print(f"  {100 * v / max(tot, 1):6.2f} %  {k:28s} {cnt[k]}")

def top(r, n=3):
    t = sorted(((num(r[i]) or 0, head[i]) for i in reasons), reverse=True)[:n]
    return ', '.join(f"{nm.replace('Warp Stall Sampling','').strip()}={v:.0f}" for v, nm in t if v > 0)

print("\ntop 80 instructions by samples:")
for r in sorted(data, key=lambda r: -(num(r[S]) or 0))[:80]:
    print(f"  {r[addr]:>8} {num(r[S]) or 0:8.0f}  {r[src][:70]:70s} {top(r)}")
print("\nall instructions with samples, in address order:")
for r in data:
    v = num(r[S]) or 0
    if v > 0:
        print(f"  {r[addr]:>8} {v:7.0f}  {r[src][:80]:80s} {top(r, 2)}")
