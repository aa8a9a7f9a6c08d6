"""Where a kernel's instructions go: the basic blocks of an Nsight Compute
source-page export, ranked by the warp instructions they executed.

On the GPU machine (the package built in place, PYTHONPATH=python):

    ncu --clock-control none --section SourceCounters -k regex:KERNEL -c 1 \\
        -o /tmp/k python3 scripts/launch_forwards.py 64x262144
    ncu --import /tmp/k.ncu-rep --page source --csv --print-source sass > $OUT/k.csv

then, anywhere: `python3 scripts/ncu_source_blocks.py k.csv [--top 30]
[--show START-END]`. A block here is a run of consecutive SASS
instructions with the same execution count (branch targets split it as the
counts change). Each line: the block's rows in the export, how often it
ran (warp-level), its length, its share of the kernel's warp instructions,
its warp-stall samples and its first instruction. `--show` prints the
instructions of a range of rows with their counts, to read one block.
"""
import argparse
import csv


def read_export(path: str):
    """(kernel name, [(address, executed, stall samples, threads, sass)])."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    kernel = rows[0][1] if rows and len(rows[0]) > 1 else "?"
    header = rows[1]
    col = {name: header.index(name) for name in (
        "Address", "Source", "Instructions Executed", "Warp Stall Sampling (All Samples)",
        "Avg. Threads Executed")}
    out = []
    for r in rows[2:]:
        if len(r) < len(header):
            continue
        num = lambda name: float(r[col[name]] or 0)
        out.append((r[col["Address"]], num("Instructions Executed"),
                    num("Warp Stall Sampling (All Samples)"), num("Avg. Threads Executed"),
                    r[col["Source"]].strip()))
    return kernel, out


def blocks(instrs):
    """Runs of consecutive instructions with equal execution counts."""
    runs = []
    for i, (_, executed, stall, _, _) in enumerate(instrs):
        if runs and runs[-1]["executed"] == executed:
            runs[-1]["end"] = i
            runs[-1]["stall"] += stall
        else:
            runs.append({"start": i, "end": i, "executed": executed, "stall": stall})
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", help="ncu --page source --csv --print-source sass export")
    parser.add_argument("--top", type=int, default=25, help="blocks to list")
    parser.add_argument("--show", help="rows START-END to print instruction by instruction")
    args = parser.parse_args()
    kernel, instrs = read_export(args.csv)
    total = sum(i[1] for i in instrs)
    stalls = sum(i[2] for i in instrs)
    print(f"{kernel}\n{total / 1e6:.2f} M warp instructions, {stalls:.0f} stall samples, "
          f"{len(instrs)} SASS instructions")
    if args.show:
        lo, hi = (int(x) for x in args.show.split("-"))
        for i in range(lo, min(hi, len(instrs) - 1) + 1):
            _, executed, stall, threads, sass = instrs[i]
            print(f"{i:6d} {executed:>10.0f} {threads:4.0f} {stall:5.0f}  {sass}")
        return
    ranked = sorted(blocks(instrs), key=lambda b: -b["executed"] * (b["end"] - b["start"] + 1))
    print(f"{'rows':>13} {'runs':>9} {'len':>4} {'share':>6} {'stalls':>6}  first instruction")
    for b in ranked[:args.top]:
        n = b["end"] - b["start"] + 1
        share = b["executed"] * n / total if total else 0.0
        print(f"{b['start']:6d}-{b['end']:<6d} {b['executed']:9.0f} {n:4d} {share:6.1%} "
              f"{b['stall']:6.0f}  {instrs[b['start']][4][:60]}")


if __name__ == "__main__":
    main()
